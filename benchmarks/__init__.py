"""Benchmarks and development tools: not imported by the server (docs/benchmarks.md lists them).

The engine against transformers (`python -m benchmarks`), against another checkout
(`python -m benchmarks.commits`), perplexity per weight format, the CUDA workloads of the GPU
check, the stream self-check's cost and the Triton kernels' compile check for sm_90. The dated
runs are under results/.
"""
