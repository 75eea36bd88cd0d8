"""PURE. Predictor, value model, placement and gap planners, risk control, credits, baselines."""
