"""`python -m engine.roofline [MODEL] --batch B --context C`: one decode step's roofline table.

MODEL is a model folder (its config.json), one of the named architectures (`llama3-8b`, ...), or
by default the embedded default model. The machine is a preset GPU or this host, measured (and
cached; see `engine.roofline.measure`) in the dtype the weight bytes imply.
"""
from __future__ import annotations

import argparse
import logging
import sys

from engine.models.config import ModelArch, read_hf_config
from engine.roofline.cost_model import RooflineModel, StepShape
from engine.roofline.machine import PRESETS, MachineLimits
from engine.roofline.named_configs import NAMED_CONFIGS
from engine.roofline.table import format_table


def parse_args(argv: list[str] | None, prog: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default=None,
                   help=f"a model folder, or one of {', '.join(NAMED_CONFIGS)} (default: the embedded model)")
    p.add_argument("--batch", type=int, default=1, help="sequences decoding one token each")
    p.add_argument("--context", type=int, default=4096, help="keys each sequence reads (its context length)")
    p.add_argument("--machine", choices=[*PRESETS, "measured"], default="measured",
                   help="a preset GPU, or this host measured (default)")
    p.add_argument("--weight-bytes", type=float, default=2, help="bytes per stored weight (2 bf16, 1 fp8, 0.5 int4)")
    p.add_argument("--kv-bytes", type=float, default=2, help="bytes per KV cache element")
    args = p.parse_args(argv)
    if args.batch < 1 or args.context < 1:
        p.error("--batch and --context must be at least 1")
    return args


def load_arch(model: str | None) -> tuple[str, ModelArch]:
    if model in NAMED_CONFIGS:
        return model, ModelArch.from_hf_config(NAMED_CONFIGS[model])
    from common.default_model import resolve_model_path

    path = resolve_model_path(model)
    return str(path), ModelArch.from_hf_config(read_hf_config(path))


def machine_limits(name: str, weight_bytes: float) -> MachineLimits:
    if name in PRESETS:
        return PRESETS[name]
    import torch

    from engine.host_limits import limit_torch_threads
    from engine.roofline.measure import measured_limits

    limit_torch_threads()  # the engine's thread count, so the cached entry is the engine's too
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return measured_limits(device, torch.float32 if weight_bytes >= 4 else torch.bfloat16)


def main(argv: list[str] | None = None, prog: str = "python -m engine.roofline") -> int:
    args = parse_args(argv, prog)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # a measurement says how long it took
    label, arch = load_arch(args.model)
    limits = machine_limits(args.machine, args.weight_bytes)
    model = RooflineModel(arch, weight_bytes=args.weight_bytes, kv_bytes=args.kv_bytes)
    print(f"{label}: decode, batch {args.batch}, context {args.context}; weights {args.weight_bytes:g} B, "
          f"KV {args.kv_bytes:g} B per element")
    print(limits.describe())
    print("\n".join(format_table(model.costs(StepShape.decode(args.batch, args.context)), limits)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
