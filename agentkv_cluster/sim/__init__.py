"""PURE (+numpy). Discrete-event simulator of the paper's evaluation and trace replay."""
