"""Where a low-latency call's host time goes, before and after its kernel launch.

Run under torchrun (one process per GPU, every peer over NVLink):

    python3 -m torch.distributed.run --nproc-per-node 2 ep/python/bench/host_breakdown.py

Rank 0 prints the host time per call (median of a loop the GPU runs behind) of the whole
``low_latency_dispatch`` / ``low_latency_combine`` and of the pieces they are made of: the output
allocations, the tensor checks, the handle and its views, reading the caller's stream, the stream
ordering done in the native module, and the native call with and without that ordering; then a
cProfile of the two calls. `bench_ep.py` times a call from an idle GPU, so whatever runs before the
launch counts in full there (its `*_gpu_latency` rows hide it behind a sleep kernel).
"""
import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

import torch
import torch.distributed as dist

import ibgda_ep
from ibgda_ep import Buffer

from bench_ep import host_time as per_call  # the script beside this one: host microseconds per call
from bench_ep import profile  # and its per-kernel GPU times (torch.profiler)


class Clocked:
    """Stands in for a Buffer's native runtime and notes the host clock as each native call starts
    and returns, so a call's timeline shows where the host is between its launches."""

    def __init__(self, rt, marks):
        self._rt, self._marks = rt, marks

    def __getattr__(self, name):
        f = getattr(self._rt, name)

        def clocked(*args, **kwargs):
            self._marks.append((name + " >", time.perf_counter()))
            r = f(*args, **kwargs)
            self._marks.append((name + " <", time.perf_counter()))
            return r
        return clocked


def timeline(buf, fn, iters, align=False):
    """Median host microseconds from the start of `fn` (the GPU idle) to each native call's start
    and end, and the GPU's time from an event before `fn` to one after it. With `align`, the ranks
    meet (a barrier) before each call, so a collective's wait for a late rank is not counted."""
    rt, per_mark, gpu = buf._rt, {}, []
    try:
        for i in range(iters + 2):
            if align:
                dist.barrier()
            torch.cuda.synchronize()
            marks = []
            buf._rt = Clocked(rt, marks)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            a.record()
            fn()
            marks.append(("call returned", time.perf_counter()))
            b.record()
            b.synchronize()
            buf._rt = rt
            if i < 2:
                continue  # warm-up
            gpu.append(a.elapsed_time(b) * 1e3)
            for j, (name, t) in enumerate(marks):
                per_mark.setdefault((j, name), []).append((t - t0) * 1e6)
    finally:
        buf._rt = rt
    rows = [(f"{name:32}", statistics.median(v)) for (j, name), v in sorted(per_mark.items())]
    return rows, statistics.median(gpu)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--ht-tokens", type=int, default=4096)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    world = dist.get_world_size()
    group = dist.new_group(list(range(world)))
    t, h = a.tokens, a.hidden
    buf = Buffer(group, Buffer.get_ht_buffer_size_hint(a.ht_tokens, h, world, a.topk),
                 Buffer.get_low_latency_rdma_size_hint(t, h, world, a.experts), low_latency_mode=True,
                 num_qps_per_rank=a.experts // world)
    g = torch.Generator(device=dev).manual_seed(rank)
    idx = torch.topk(torch.rand((t, a.experts), device=dev, generator=g), a.topk, dim=1).indices.to(torch.int64)
    w = torch.rand((t, a.topk), device=dev, generator=g)
    x = torch.randn((t, h), device=dev).to(torch.bfloat16)
    local = a.experts // world
    ye = torch.randn((local, world * t, h), device=dev).to(torch.bfloat16)
    state = {}

    def dispatch():
        state["r"] = buf.low_latency_dispatch(x, idx, t, a.experts, use_fp8=True)

    def combine():
        return buf.low_latency_combine(ye, idx, w, state["r"][2])

    dispatch()
    torch.cuda.synchronize()
    rows = []
    rows.append(("low_latency_dispatch, whole call", per_call(dispatch, a.iters)))
    rows.append(("low_latency_combine, whole call", per_call(combine, a.iters)))
    fp8 = getattr(torch, "float8_e4m3fn")
    rows.append(("torch.empty recv_x [local, R*T, H] fp8", per_call(lambda: torch.empty((local, world * t, h), dtype=fp8, device=dev), a.iters)))
    rows.append(("torch.empty scales", per_call(lambda: torch.empty((local, world * t, h // 128), dtype=torch.float32, device=dev), a.iters)))
    rows.append(("torch.empty combined_x [T, H] bf16", per_call(lambda: torch.empty((t, h), dtype=torch.bfloat16, device=dev), a.iters)))
    rows.append(("Buffer._current_raw_stream", per_call(buf._current_raw_stream, a.iters)))
    # The Python layer's other pieces of a low-latency dispatch, one at a time.
    rows.append(("Buffer._check of x (type, device, dtype, layout)",
                 per_call(lambda: buf._check("c", "x", x, torch.bfloat16), a.iters)))
    hd0 = state["r"][2]
    words = hd0.words
    nwords = words.numel()
    rows.append(("torch.empty handle words [n] i32", per_call(lambda: torch.empty((nwords,), dtype=torch.int32, device=dev), a.iters)))
    rows.append(("words[:local] (the recv_count view)", per_call(lambda: words[:local], a.iters)))
    rows.append(("LowLatencyHandle(...)", per_call(
        lambda: ibgda_ep.LowLatencyHandle(buf, hd0.geo, t, t, h, a.experts, words, hd0._at), a.iters)))
    rows.append(("EventOverlap()", per_call(ibgda_ep.EventOverlap, a.iters)))
    s = buf._current_raw_stream()
    rt = buf._rt
    rows.append(("native wait_for_stream (record + wait)", per_call(lambda: rt.wait_for_stream(s), a.iters)))
    rows.append(("native release_to_stream (record + wait)", per_call(lambda: rt.release_to_stream(s), a.iters)))
    # The native dispatch with the arguments the last call used, without and with the ordering.
    r = state["r"]
    hd = r[2]
    recv = (r[0][0].data_ptr(), r[0][1].data_ptr(), r[1].data_ptr())
    rows.append(("native ll_dispatch, no ordering", per_call(
        lambda: rt.ll_dispatch(hd.geo, a.experts, x.data_ptr(), idx.data_ptr(), t, hd._ptrs(), recv), a.iters)))
    torch.cuda.synchronize()
    rows.append(("native ll_dispatch, ordered both ways", per_call(
        lambda: rt.ll_dispatch(hd.geo, a.experts, x.data_ptr(), idx.data_ptr(), t, hd._ptrs(), recv, s, True),
        a.iters)))
    torch.cuda.synchronize()
    # High-throughput: a cached dispatch (FP8) and a combine of 4,096 tokens.
    ht_idx = torch.topk(torch.rand((a.ht_tokens, a.experts), device=dev, generator=g), a.topk, dim=1).indices.to(torch.int64)
    ht_w = torch.rand((a.ht_tokens, a.topk), device=dev, generator=g)
    ht_x = torch.randn((a.ht_tokens, h), device=dev).to(torch.bfloat16)
    xq = (ht_x.to(fp8), torch.ones((a.ht_tokens, h // 128), device=dev))
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(ht_idx, a.experts)
    rx, _, _, _, ht_handle, _ = buf.dispatch(xq, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                             num_tokens_per_expert=per_expert, topk_idx=ht_idx, topk_weights=ht_w)
    y = rx[0].to(torch.bfloat16)
    rows.append(("dispatch (cached), whole call", per_call(lambda: buf.dispatch(xq, handle=ht_handle), a.iters)))

    def fresh():
        pr, _, pe_, ir, _ = buf.get_dispatch_layout(ht_idx, a.experts)
        return buf.dispatch(xq, num_tokens_per_rank=pr, is_token_in_rank=ir, num_tokens_per_expert=pe_,
                            topk_idx=ht_idx, topk_weights=ht_w)
    fresh_rows, fresh_gpu = timeline(buf, fresh, 20)
    aligned_rows, aligned_gpu = timeline(buf, fresh, 20, align=True)
    cached_rows, cached_gpu = timeline(buf, lambda: buf.dispatch(xq, handle=ht_handle), 20)
    ll_d_rows, ll_d_gpu = timeline(buf, dispatch, 20)
    ll_c_rows, ll_c_gpu = timeline(buf, combine, 20)
    torch.cuda.synchronize()
    profile("layout + non-cached dispatch", fresh, rank)
    rows.append(("combine, whole call", per_call(lambda: buf.combine(y, ht_handle), a.iters)))
    nrecv = rx[0].shape[0]
    rows.append((f"torch.empty recv_x [{nrecv}, H] fp8", per_call(lambda: torch.empty((nrecv, h), dtype=fp8, device=dev), a.iters)))
    torch.cuda.synchronize()
    ht_prof = cProfile.Profile()
    ht_prof.enable()
    for _ in range(a.iters // 4):
        buf.dispatch(xq, handle=ht_handle)
        buf.combine(y, ht_handle)
    ht_prof.disable()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.iters):
        dispatch()
        combine()
    prof.disable()
    torch.cuda.synchronize()
    if rank == 0:
        print(f"host-breakdown: EP{world}, {t} tokens, hidden {h}, top-{a.topk} of {a.experts}, "
              f"ibgda_ep {getattr(ibgda_ep, '__version__', '?')}")
        for what, us in rows:
            print(f"host-breakdown: {what:45} {us:8.1f} us")
        for what, tl, g in (("layout + non-cached dispatch", fresh_rows, fresh_gpu),
                            ("layout + non-cached dispatch, the ranks aligned by a barrier first", aligned_rows, aligned_gpu),
                            ("cached dispatch", cached_rows, cached_gpu),
                            ("low-latency dispatch", ll_d_rows, ll_d_gpu),
                            ("low-latency combine", ll_c_rows, ll_c_gpu)):
            print(f"host-breakdown: timeline of a {what} from an idle GPU (host us since the call; "
                  f"events around it: {g:.1f} us)")
            for name, us in tl:
                print(f"host-breakdown:     {name} {us:8.1f}")
        for what, pr in (("low latency", prof), ("high throughput", ht_prof)):
            out = io.StringIO()
            pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(18)
            print(f"host-breakdown: cProfile, {what} dispatch + combine")
            print(out.getvalue())
    dist.barrier()
    buf.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
