#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention on the shapes of AttentionGpuBench, for a side-by-side baseline.

llama3-8b layer geometry: 32 query heads, 8 kv heads (GQA through enable_gqa), head size 128, f16 cache.
  decode:  one query per sequence over 4K, 32K, 128K cached tokens, batch 1 and 16 (contiguous f16 K/V)
  prefill: causal self-attention of 4K and 32K tokens, batch 1
Times are the median of CUDA-event-timed calls after warm-up. Decode is timed as AttentionGpuBench times it: 10 calls
captured into one CUDA graph and replayed (the time, and GB/s from it), and beside that called one at a time from
Python (host launch time included). Decode GB/s counts the K and V bytes read; prefill
TFLOP/s counts 2 * L^2 * d * heads (the causal half of QK^T and PV), as the Java benchmark does.
Prints a markdown table; the backend PyTorch picked is reported by torch, not chosen here.
"""
import statistics
import sys

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, D = 32, 8, 128


def timed(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_timed(fn, inner=10, warmup=1, reps=10):
    """Milliseconds of one fn() as a graph replays it: inner calls captured into one graph, median replay / inner."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    ms = timed(graph.replay, warmup, reps) / inner
    del graph
    return ms


def main():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print()
    print("### PyTorch SDPA decode (f16 cache, enable_gqa)")
    print()
    print("| cached tokens | batch | time (µs, median) | cache read (GB/s) | called (µs, median) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for length in (4096, 32768, 131072):
        for batch in (1, 16):
            q = torch.randn(batch, HEADS, 1, D, device=dev, dtype=torch.float16)
            k = torch.randn(batch, KV_HEADS, length, D, device=dev, dtype=torch.float16)
            v = torch.randn(batch, KV_HEADS, length, D, device=dev, dtype=torch.float16)
            called = timed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), 3, 20)
            ms = graph_timed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
            gbps = (k.numel() + v.numel()) * 2 / (ms * 1e-3) / 1e9
            print(f"| {length} | {batch} | {ms * 1e3:.1f} | {gbps:.0f} | {called * 1e3:.1f} |", flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    print()
    print("### PyTorch SDPA prefill (causal, f16, enable_gqa)")
    print()
    print("| tokens | time (ms, median) | TFLOP/s |")
    print("| ---: | ---: | ---: |")
    for length in (4096, 32768):
        q = torch.randn(1, HEADS, length, D, device=dev, dtype=torch.float16)
        k = torch.randn(1, KV_HEADS, length, D, device=dev, dtype=torch.float16)
        v = torch.randn(1, KV_HEADS, length, D, device=dev, dtype=torch.float16)
        reps = 5 if length > 8192 else 10
        ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), 2, reps)
        tflops = 2.0 * length * length * D * HEADS / (ms * 1e-3) / 1e12
        print(f"| {length} | {ms:.2f} | {tflops:.1f} |", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
