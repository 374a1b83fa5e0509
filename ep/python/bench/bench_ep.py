"""Dispatch/combine benchmark with DeepEP's standard configurations and byte accounting.

Run one process per GPU: ``torchrun --nproc-per-node N ep/python/bench/bench_ep.py --csv out.csv``.
High-throughput: 4096 tokens/rank, hidden 7168, top-8 of 256 experts, FP8 dispatch, BF16
combine; bandwidth = recv rows * hidden * (1 + 4/128) bytes (dispatch) and * 2 (combine) per
kernel-pair time (DeepEP's NVL accounting, local rows included). Low-latency: 128 tokens,
same model; latency of dispatch and combine. CUDA events, warm-up, median of --iters, random
data; outputs checked for shape. Rows: system,mode,metric,tokens,value,unit.
"""

import argparse
import os
import statistics

import torch

from ibgda_ep import Buffer


def timed(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def routing(tokens, experts, topk, dev):
    scores = torch.rand((tokens, experts), device=dev)
    return torch.topk(scores, topk, dim=1).indices.to(torch.int64), torch.rand((tokens, topk), device=dev)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--tokens", type=str, default="4096")
    p.add_argument("--ll-tokens", type=int, default=128)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--num-sms", type=int, default=24)
    p.add_argument("--csv", type=str, default="")
    a = p.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    sweep = [int(t) for t in a.tokens.split(",")]
    Buffer.set_num_sms(a.num_sms)
    buf = Buffer(None, Buffer.get_ht_buffer_size_hint(max(sweep), a.hidden, world, a.topk),
                 Buffer.get_low_latency_rdma_size_hint(a.ll_tokens, a.hidden, world, a.experts))
    rows = []
    for tokens in sweep:
        idx, w = routing(tokens, a.experts, a.topk, dev)
        x = torch.randn((tokens, a.hidden), device=dev).to(torch.bfloat16)
        amax = x.float().view(tokens, -1, 128).abs().amax(2).clamp(min=1e-4)
        xq = ((x.float().view(tokens, -1, 128) * (448 / amax.unsqueeze(2))).to(torch.float8_e4m3fn).view(tokens, -1), amax / 448)
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, a.experts)
        rx, ri, rw, counts, handle, _ = buf.dispatch(xq, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                                     num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
        n = handle.num_recv
        assert rx[0].shape == (n, a.hidden) and sum(counts) == int(per_expert.sum()) or world > 1
        y = torch.randn((n, a.hidden), device=dev).to(torch.bfloat16)
        t_d = timed(lambda: buf.dispatch(xq, handle=handle), a.iters)
        t_c = timed(lambda: buf.combine(y, handle), a.iters)
        bd = n * a.hidden * (1 + 4 / 128)
        bc = n * a.hidden * 2
        rows += [("ibgda-ep", "ht", "dispatch_bw", tokens, bd / t_d / 1e3, "GB/s"),
                 ("ibgda-ep", "ht", "combine_bw", tokens, bc / t_c / 1e3, "GB/s"),
                 ("ibgda-ep", "ht", "dispatch_latency", tokens, t_d, "us"),
                 ("ibgda-ep", "ht", "combine_latency", tokens, t_c, "us")]
    t = a.ll_tokens
    idx, w = routing(t, a.experts, a.topk, dev)
    x = torch.randn((t, a.hidden), device=dev).to(torch.bfloat16)
    state = {}

    def ll_dispatch():
        state["r"] = buf.low_latency_dispatch(x, idx, t, a.experts, use_fp8=True)

    ll_dispatch()
    local = a.experts // world
    ye = torch.randn((local, world * t, a.hidden), device=dev).to(torch.bfloat16)
    t_d = timed(lambda: (ll_dispatch(), buf.low_latency_combine(ye, idx, w, state["r"][2])), a.iters)
    t_only = timed(ll_dispatch, a.iters)
    sel = int((idx >= 0).sum())
    rows += [("ibgda-ep", "ll", "dispatch_latency", t, t_only, "us"),
             ("ibgda-ep", "ll", "combine_latency", t, t_d - t_only, "us"),
             ("ibgda-ep", "ll", "dispatch_bw", t, sel * (a.hidden + a.hidden / 128 * 4 + 16) / t_only / 1e3, "GB/s"),
             ("ibgda-ep", "ll", "combine_bw", t, sel * a.hidden * 2 / max(t_d - t_only, 1e-3) / 1e3, "GB/s")]
    if rank == 0:
        print(f"bench_ep: {world} ranks, transports {buf.transports()}, num_sms {a.num_sms}")
        for r in rows:
            print(f"  {r[1]:2} {r[2]:17} tokens={r[3]:5}  {r[4]:10.2f} {r[5]}")
        if a.csv:
            new = not os.path.exists(a.csv)
            with open(a.csv, "a") as f:
                if new:
                    f.write("system,mode,metric,tokens,value,unit\n")
                for r in rows:
                    f.write(f"{r[0]},{r[1]},{r[2]},{r[3]},{r[4]:.3f},{r[5]}\n")
    buf.destroy()


if __name__ == "__main__":
    main()
