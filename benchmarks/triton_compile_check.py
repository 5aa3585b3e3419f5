"""Compile the CUDA backend's Triton kernels for a Hopper GPU (sm_90) on a machine without one.

    python -m benchmarks.triton_compile_check [--dtypes fp32,fp16,bf16] [--groups 1,3,8]

Triton's interpreter, which runs the kernels on a CPU in `make test`, accepts programs that its
compiler refuses (shapes, dtypes and masks it never lowers), so the kernels are also compiled here
to PTX and cubin through Triton's own ptxas, for every dtype and the head sizes of the models we
serve, the way a CUDA machine would compile them at their first launch. Needs Triton's NVIDIA
backend (in the x86-64 wheel) and must run without TRITON_INTERPRET, which swaps `triton.jit`
for the interpreter as triton is imported.
"""
from __future__ import annotations

import argparse
import inspect
import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.attention import triton_kernels as kernels

HOPPER = GPUTarget("cuda", 90, 32)
INDEX_POINTERS = {"slot_ptr": "*i64", "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "query_start_ptr": "*i32",
                  "query_len_ptr": "*i32", "context_len_ptr": "*i32", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}


def argument_types(name: str, dtype: str) -> str:
    """The launchers' argument types: data pointers of the dtype, index pointers, 32-bit strides
    (64-bit for the caches', which pass 2^31 in a large cache), a float32 scale."""
    if name.endswith("_ptr"):
        return INDEX_POINTERS.get(name, "*" + dtype)
    if name == "scale":
        return "fp32"
    return "i64" if name.startswith("stride_c") else "i32"


def compile_for_hopper(kernel, dtype: str, constants: dict) -> None:
    names = list(inspect.signature(kernel.fn).parameters)
    signature = {n: "constexpr" if n in constants else argument_types(n, dtype) for n in names}
    triton.compile(ASTSource(kernel, signature, constexprs=constants), target=HOPPER)


def configurations(dtypes=("fp32", "fp16", "bf16"), head_dims=(64, 128), groups=(1, 3, 8)):
    """(kernel, dtype, constants) as the launchers in triton_kernels.py pass them."""
    for dtype in dtypes:
        precision = "ieee" if dtype == "fp32" else "tf32"
        for head_dim in head_dims:
            yield kernels._store_kv_kernel, dtype, dict(BLOCK_SIZE=16, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim)
            yield kernels._decode_merge_kernel, dtype, dict(NUM_SPLITS=8, NUM_SPLITS_PAD=8, HEAD_DIM=head_dim,
                                                            HEAD_DIM_PAD=head_dim)
            for group in groups:
                yield kernels._decode_split_kernel, dtype, dict(
                    GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
                    HEAD_DIM_PAD=head_dim, BLOCK_SIZE=16, BLOCK_N=32, NUM_SPLITS=8, PRECISION=precision)
                yield kernels._prefill_kernel, dtype, dict(GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim,
                                                           BLOCK_SIZE=16, BLOCK_M=64, BLOCK_N=64, PRECISION=precision)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="fp32,fp16,bf16")
    ap.add_argument("--groups", default="1,3,8", help="query heads per KV head")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("TRITON_INTERPRET=1: the kernels are the interpreter's; run without it", file=sys.stderr)
        return 2
    count = 0
    for kernel, dtype, constants in configurations(tuple(args.dtypes.split(",")),
                                                   groups=tuple(int(g) for g in args.groups.split(","))):
        compile_for_hopper(kernel, dtype, constants)
        count += 1
    print(f"{count} kernel configurations compiled for sm_90 (triton {triton.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
