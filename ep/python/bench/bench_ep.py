"""Dispatch/combine benchmark with DeepEP's standard configurations and byte accounting, for
ibgda_ep and, in the same run on the same GPUs, the same dispatch/combine done with
``torch.distributed.all_to_all_single`` over NCCL and DeepEP V1 itself (when ``deep_ep`` is
importable).

Run one process per GPU: ``torchrun --nproc-per-node N ep/python/bench/bench_ep.py --csv out.csv``.

High-throughput (``ht``): 4096 tokens/rank, hidden 7168, top-8 of 256 experts, FP8 dispatch, BF16
combine; bandwidth = recv rows * hidden * (1 + 4/128) bytes (dispatch) and * 2 (combine) per
call (DeepEP's NVL accounting, local rows included). Low-latency (``ll``): 128 tokens, same model;
latency of dispatch and of combine, from an idle GPU (the host's time before the launch counted,
``*_latency``) and behind a sleep kernel (the GPU's time alone, ``*_gpu_latency``), with the
host's time per call beside them (``*_host``). CUDA events, warm-up, median of --iters, random
data and routing (seeded per rank, the same for every system). Outputs are checked: every system must
receive the same rows (ibgda-ep and NCCL row for row, DeepEP by an order-free checksum) and
combine must return each token's weighted sum. Rows: system,mode,metric,tokens,value,unit.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import ibgda_ep  # noqa: F401  (before any CUDA call: over the emulated NIC it picks eager module loading)


def timed(fn, iters, warmup=3, hide_host_cycles=0):
    """Median microseconds from an event recorded before `fn` to one after it, with the GPU idle
    when `fn` starts, so the host's time before its first launch counts in full; with
    `hide_host_cycles`, a sleep kernel of that many cycles runs first and the first event after
    it, so `fn`'s launches are queued before the GPU reaches them: the GPU's time alone."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hide_host_cycles:
            torch.cuda._sleep(hide_host_cycles)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def sleep_cycles(us):
    """The `torch.cuda._sleep` argument that keeps this GPU busy for about `us` microseconds."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # warm-up
    a.record()
    torch.cuda._sleep(1_000_000)
    b.record()
    b.synchronize()
    return int(1_000_000 * us / max(a.elapsed_time(b) * 1e3, 1.0))


def host_time(fn, iters):
    """The host's time per call (median, microseconds) with the GPU left to run behind: what a
    call costs before its kernel can start, which `timed` counts in full when the GPU is idle."""
    fn()
    torch.cuda.current_stream().synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.current_stream().synchronize()
    return statistics.median(times)


def routing(tokens, experts, topk, dev, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    scores = torch.rand((tokens, experts), device=dev, generator=g)
    idx = torch.topk(scores, topk, dim=1).indices.to(torch.int64)
    return idx, torch.rand((tokens, topk), device=dev, generator=g)


def quantize(x):
    t = x.shape[0]
    amax = x.float().view(t, -1, 128).abs().amax(2).clamp(min=1e-4)
    q = (x.float().view(t, -1, 128) * (448 / amax.unsqueeze(2))).to(torch.float8_e4m3fn).view(t, -1)
    return q, (amax / 448).contiguous()


class NcclAllToAll:
    """Dispatch and combine as an NCCL EP layer does them without a custom kernel: each token is
    copied once per destination rank into one send buffer (FP8 row, scales, top-k indices and
    weights in one row), the per-rank counts are exchanged and read on the host, one
    ``all_to_all_single`` moves the rows; combine moves the expert outputs back the same way and
    sums them into each token's place with ``index_add_``."""

    def __init__(self, world, experts):
        self.world, self.local = world, experts // world

    def layout(self, idx):
        t = idx.shape[0]
        mask = torch.zeros((t, self.world), dtype=torch.bool, device=idx.device)
        valid = idx >= 0
        mask.scatter_(1, torch.where(valid, idx // self.local, 0), valid)
        rank, token = mask.t().nonzero(as_tuple=True)  # sorted by destination, then token
        send = mask.sum(0).to(torch.int64)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        return token, send.tolist(), recv.tolist()

    def dispatch(self, xq, idx, w):
        token, send, recv = self.layout(idx)
        x, s = xq
        row = torch.cat([x.view(torch.uint8), s.view(torch.uint8), idx.view(torch.uint8), w.view(torch.uint8)], 1)
        payload = row.index_select(0, token)
        out = torch.empty((sum(recv), row.shape[1]), dtype=torch.uint8, device=row.device)
        dist.all_to_all_single(out, payload, recv, send)
        h, k = x.shape[1], idx.shape[1]
        sb = s.shape[1] * 4
        rx = out[:, :h].contiguous().view(torch.float8_e4m3fn)
        rs = out[:, h:h + sb].contiguous().view(torch.float32)
        ri = out[:, h + sb:h + sb + 8 * k].contiguous().view(torch.int64)
        rw = out[:, h + sb + 8 * k:].contiguous().view(torch.float32)
        return (rx, rs), ri, rw, (token, send, recv, x.shape[0])

    def combine(self, y, handle):
        token, send, recv, tokens = handle
        back = torch.empty((sum(send), y.shape[1]), dtype=y.dtype, device=y.device)
        dist.all_to_all_single(back, y, send, recv)
        out = torch.zeros((tokens, y.shape[1]), dtype=torch.float32, device=y.device)
        out.index_add_(0, token, back.float())
        return out.to(torch.bfloat16)


def ht_ours(buf, xq, idx, w, experts):
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, experts)
    rx, ri, rw, counts, handle, _ = buf.dispatch(xq, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                                 num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
    return rx, handle, (lambda: buf.dispatch(xq, handle=handle)), (lambda y: buf.combine(y, handle)[0])


def profile(what, fn, rank, iters=5):
    """Prints the GPU time per call of each kernel `fn` launches (CUPTI through torch.profiler):
    what the events above measure, less the host's share."""
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.current_stream().synchronize()
    if rank == 0:
        print(f"profile: {what}: GPU time per call of each kernel")
        for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:12]:
            print(f"    {e.key[:60]:60} {e.device_time_total / iters:10.1f} us  x{e.count // iters}")


def remote_pairs(idx, experts, world, rank):
    """(token, destination rank) pairs of this rank's routing whose destination is another rank:
    the rows that cross the NIC when every peer is reached through it."""
    per_rank = experts // world
    dest = torch.where(idx >= 0, idx // per_rank, torch.full_like(idx, -1))
    hit = torch.zeros((idx.shape[0], world), dtype=torch.bool, device=idx.device)
    rows = torch.arange(idx.shape[0], device=idx.device).unsqueeze(1).expand_as(dest)
    ok = dest >= 0
    hit[rows[ok], dest[ok]] = True
    hit[:, rank] = False
    return int(hit.sum())


def over_nvlink(system):
    """Whether `system` reaches the other ranks over NVLink here: DeepEP and NCCL always do,
    ibgda-ep unless IBGDA_TRANSPORT sends its peers through the NIC or the proxy."""
    return system != "ibgda-ep" or os.environ.get("IBGDA_TRANSPORT", "auto") in ("", "auto", "p2p")


def every_routing(idx, world):
    """Every rank's `topk_idx`, gathered (the same shape on every rank)."""
    every = [torch.empty_like(idx) for _ in range(world)]
    dist.all_gather(every, idx)
    return every


def expected_rows(idx, experts, world, rank):
    """The rows this rank must receive in a high-throughput dispatch, from every rank's routing
    (gathered): one per (source token, this rank) pair with an expert here. Each system's count
    is checked against it, not against another system's."""
    per_rank = experts // world
    return sum(int(((g >= 0) & (g // per_rank == rank)).any(dim=1).sum()) for g in every_routing(idx, world))


def expected_ll_counts(idx, experts, world, rank):
    """Tokens each local expert of this rank must receive in a low-latency dispatch, from every
    rank's routing (gathered)."""
    local = experts // world
    want = torch.zeros(local, dtype=torch.int64, device=idx.device)
    for g in every_routing(idx, world):
        mine = g[(g >= rank * local) & (g < (rank + 1) * local)] - rank * local
        want += torch.bincount(mine, minlength=local)
    return want


def checksum(rx):
    """Order-free fingerprint of received FP8 rows: the sum of every row's dequantised values."""
    x, s = rx
    return float((x.float().view(x.shape[0], -1, 128) * s.unsqueeze(2)).sum())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--tokens", type=str, default="4096", help="high-throughput token counts, comma-separated (empty: none)")
    p.add_argument("--ll-tokens", type=int, default=128)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--num-sms", type=int, default=24)
    p.add_argument("--systems", type=str, default="ibgda-ep,nccl,deepep")
    p.add_argument("--csv", type=str, default="",
                   help="append the rows (system,mode,metric,tokens,value,unit) to this file, with a header when it "
                        "is new, so runs of several settings gather in one file; remove it first for one run's rows")
    p.add_argument("--profile", action="store_true", help="also print each system's GPU kernel times (torch.profiler)")
    p.add_argument("--nic-csv", type=str, default="",
                   help="also write ibgda-ep's rows as system,transport,mode,metric,tokens,value,unit with the bytes "
                        "that cross the NIC and nic_link_fraction rows (the modelled link time of those bytes, plus two "
                        "modelled latencies for low latency, over the measured time); the transport is IBGDA_TRANSPORT; "
                        "appended to, as --csv")
    p.add_argument("--nic-link-gbps", type=float, default=float(os.environ.get("IBGDA_NIC_LINK_GBPS", "400")),
                   help="the modelled link rate for --nic-csv (default IBGDA_NIC_LINK_GBPS or 400, the CX-7 model's)")
    p.add_argument("--nic-latency-us", type=float, default=float(os.environ.get("IBGDA_NIC_LATENCY_NS", "600")) / 1e3,
                   help="the modelled one-way latency for --nic-csv (default IBGDA_NIC_LATENCY_NS or 600 ns)")
    p.add_argument("--nvlink-gbs", type=float, default=380.0,
                   help="one GPU's NVLink rate per direction for the HT nvlink_fraction rows (default 380 GB/s: "
                        "a pair of H200s (NV18) moves 370 to 396 GB/s one way)")
    a = p.parse_args()
    if os.environ.get("IBGDA_EP_STACK_DUMP_S"):  # diagnosis: every thread's Python stack after N s
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["IBGDA_EP_STACK_DUMP_S"]), exit=False)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    systems = a.systems.split(",")
    # Only NCCL and DeepEP need an NCCL communicator; ibgda-ep alone keeps NCCL off the GPU (over
    # the emulated NIC its engine kernel runs throughout, and NCCL's setup would wait for it).
    if {"nccl", "deepep"} & set(systems):
        dist.init_process_group("nccl", device_id=dev)
    else:
        dist.init_process_group("gloo")
    group = dist.group.WORLD
    sweep = [int(t) for t in a.tokens.split(",") if t]  # empty: low latency alone
    rows, notes = [], []
    bufs = {}
    if "ibgda-ep" in systems:
        from ibgda_ep import Buffer
        Buffer.set_num_sms(a.num_sms)
        bufs["ibgda-ep"] = Buffer(group, Buffer.get_ht_buffer_size_hint(max(sweep, default=1), a.hidden, world, a.topk),
                                  Buffer.get_low_latency_rdma_size_hint(a.ll_tokens, a.hidden, world, a.experts))
        notes.append(f"ibgda-ep transports {bufs['ibgda-ep'].transports()}")
    deep = None
    if "deepep" in systems:
        try:
            import deep_ep
            deep = deep_ep
            deep_ep.Buffer.set_num_sms(a.num_sms)
            bufs["deepep"] = deep_ep.Buffer(group, int(2e9), 0)
        except Exception as e:  # not built on this machine: say so, measure the rest
            notes.append(f"deepep: not measured ({type(e).__name__}: {e})")
    nccl = NcclAllToAll(world, a.experts) if "nccl" in systems else None

    def add(system, mode, metric, tokens, value, unit):
        rows.append((system, mode, metric, tokens, value, unit))

    nic_rows = []

    for tokens in sweep:
        idx, w = routing(tokens, a.experts, a.topk, dev, 1000 * rank + tokens)
        x = torch.randn((tokens, a.hidden), device=dev, generator=torch.Generator(device=dev).manual_seed(rank)).to(torch.bfloat16)
        xq = quantize(x)
        # (token, rank) pairs this rank sends to another rank: the HT rows that cross NVLink (or
        # the NIC), without the local ones.
        remote = remote_pairs(idx, a.experts, world, rank)
        results = {}
        for system in systems:
            if system == "nccl":
                rx, ri, rw, handle = nccl.dispatch(xq, idx, w)
                d = lambda: nccl.dispatch(xq, idx, w)  # noqa: E731
                c = lambda y: nccl.combine(y, handle)  # noqa: E731
            elif system in bufs:
                b = bufs[system]
                if system == "ibgda-ep":
                    rx, handle, d, c = ht_ours(b, xq, idx, w, a.experts)
                else:
                    per_rank, _, per_expert, in_rank, _ = b.get_dispatch_layout(idx, a.experts)
                    rx, _, _, _, handle, _ = b.dispatch(xq, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                                        num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
                    d = (lambda b=b, h=handle: b.dispatch(xq, handle=h))
                    c = (lambda y, b=b, h=handle: b.combine(y, h)[0])
            else:
                continue
            n = rx[0].shape[0]
            # Expert outputs: the received row itself (dequantised), so combine must give back
            # x times the number of ranks the token went to: a check that every row came home.
            y = (rx[0].float().view(n, -1, 128) * rx[1].unsqueeze(2)).view(n, -1).to(torch.bfloat16)
            out = c(y)
            torch.cuda.current_stream().synchronize()
            results[system] = (n, checksum(rx), rx, out)
            t_d = timed(d, a.iters)
            t_c = timed(lambda: c(y), a.iters)
            if a.profile and tokens == max(sweep):
                profile(f"{system} ht dispatch+combine, {tokens} tokens", lambda: (d(), c(y)), rank)
            add(system, "ht", "dispatch_bw", tokens, n * a.hidden * (1 + 4 / 128) / t_d / 1e3, "GB/s")
            add(system, "ht", "combine_bw", tokens, n * a.hidden * 2 / t_c / 1e3, "GB/s")
            add(system, "ht", "dispatch_latency", tokens, t_d, "us")
            add(system, "ht", "combine_latency", tokens, t_c, "us")
            # Bytes per row that leaves this GPU (FP8 row and its scales; BF16 row back), and the time.
            remote_calls = (("dispatch", a.hidden * (1 + 4 / 128), t_d), ("combine", a.hidden * 2, t_c))
            if over_nvlink(system):
                # Only the bytes that leave this GPU, against what its NVLink moves one way.
                for what, per_row, t_meas in remote_calls:
                    gbs = remote * per_row / t_meas / 1e3
                    add(system, "ht", f"{what}_nvlink_bw", tokens, gbs, "GB/s")
                    add(system, "ht", f"{what}_nvlink_fraction", tokens, gbs / a.nvlink_gbs, "of the link")
            if system != "nccl":
                # The host's time per call, the GPU left to run behind (see host_time).
                add(system, "ht", "dispatch_host", tokens, host_time(d, a.iters), "us")
                add(system, "ht", "combine_host", tokens, host_time(lambda: c(y), a.iters), "us")

                # A training step's dispatch: new routing every step, so get_dispatch_layout and a
                # non-cached dispatch (the count exchange read by the host), from an idle GPU.
                def fresh(b=b):
                    pr, _, pe_, ir, _ = b.get_dispatch_layout(idx, a.experts)
                    return b.dispatch(xq, num_tokens_per_rank=pr, is_token_in_rank=ir, num_tokens_per_expert=pe_,
                                      topk_idx=idx, topk_weights=w)
                add(system, "ht", "dispatch_fresh_latency", tokens, timed(fresh, a.iters), "us")
                add(system, "ht", "dispatch_fresh_host", tokens, host_time(fresh, a.iters), "us")
            if system == "ibgda-ep" and a.nic_csv:
                link = a.nic_link_gbps / 8 * 1e3  # bytes per us
                for what, per_row, t_meas in remote_calls:
                    nbytes = remote * per_row
                    nic_rows.append(("ht", f"{what}_nic_bytes", tokens, nbytes, "bytes"))
                    nic_rows.append(("ht", f"{what}_nic_link_fraction", tokens, nbytes / link / t_meas, "of the modelled link"))
        # The systems must agree: the rows the routing sends here, the same rows, the same
        # combined output.
        want = expected_rows(idx, a.experts, world, rank)
        ref = results.get("nccl") or next(iter(results.values()), None)
        for system, (n, cs, rx, out) in results.items():
            assert n == want, f"{system}: received {n} rows on rank {rank}, the routing sends {want}"
            assert abs(cs - ref[1]) <= 1e-3 * max(1.0, abs(ref[1])), f"{system}: row checksum {cs} vs {ref[1]}"
            if system == "ibgda-ep" and "nccl" in results:
                assert torch.equal(rx[0].view(torch.uint8), results["nccl"][2][0].view(torch.uint8)), \
                    "ibgda-ep and NCCL received different rows"
            err = (out.float() - ref[3].float()).abs().max().item()
            assert err <= 0.02 * max(1.0, ref[3].float().abs().max().item()), f"{system}: combine differs by {err}"
        notes.append(f"tokens {tokens}: " + ", ".join(f"{s} {v[0]} rows" for s, v in results.items()) + ", outputs agree")

    t = a.ll_tokens
    idx, w = routing(t, a.experts, a.topk, dev, 7 + rank)
    x = torch.randn((t, a.hidden), device=dev).to(torch.bfloat16)
    local = a.experts // world
    ye = torch.randn((local, world * t, a.hidden), device=dev).to(torch.bfloat16)
    sel = int((idx >= 0).sum())
    hide = sleep_cycles(500)
    ll_want = expected_ll_counts(idx, a.experts, world, rank)
    ll = {}
    if "ibgda-ep" in bufs:
        ll["ibgda-ep"] = bufs["ibgda-ep"]
    if deep is not None and "deepep" in systems:
        try:
            ll["deepep"] = deep.Buffer(group, 0, deep.Buffer.get_low_latency_rdma_size_hint(t, a.hidden, world, a.experts),
                                       low_latency_mode=True, num_qps_per_rank=max(1, a.experts // world))
        except Exception as e:
            notes.append(f"deepep low-latency: not measured ({type(e).__name__}: {e})")
    for system, b in ll.items():
        state = {}

        def ll_dispatch(b=b, state=state):
            state["r"] = b.low_latency_dispatch(x, idx, t, a.experts, use_fp8=True)

        try:
            ll_dispatch()
            torch.cuda.current_stream().synchronize()
            t_both = timed(lambda: (ll_dispatch(), b.low_latency_combine(ye, idx, w, state["r"][2])), a.iters)
            t_only = timed(ll_dispatch, a.iters)
            # The same with the host's time hidden behind a sleep kernel (500 us, more than any
            # call's host time seen): what the GPU spends, launches and waits for peers included.
            g_both = timed(lambda: (ll_dispatch(), b.low_latency_combine(ye, idx, w, state["r"][2])), a.iters,
                           hide_host_cycles=hide)
            g_only = timed(ll_dispatch, a.iters, hide_host_cycles=hide)
        except Exception as e:
            notes.append(f"{system} low-latency: failed ({type(e).__name__}: {e})")
            continue
        if a.profile:
            profile(f"{system} ll dispatch+combine", lambda: (ll_dispatch(), b.low_latency_combine(ye, idx, w, state["r"][2])), rank)
        h_d = host_time(ll_dispatch, a.iters)
        h_c = host_time(lambda: b.low_latency_combine(ye, idx, w, state["r"][2]), a.iters)
        # The last dispatch's per-expert counts against the routing: a call whose kernels did
        # not run, or ran unordered with the caller's stream, would not give them.
        got = state["r"][1].to(torch.int64)
        assert torch.equal(got, ll_want), f"{system}: low-latency counts {got.tolist()} vs {ll_want.tolist()} on rank {rank}"
        add(system, "ll", "dispatch_latency", t, t_only, "us")
        add(system, "ll", "combine_latency", t, t_both - t_only, "us")
        add(system, "ll", "dispatch_bw", t, sel * (a.hidden + a.hidden / 128 * 4 + 16) / t_only / 1e3, "GB/s")
        add(system, "ll", "combine_bw", t, sel * a.hidden * 2 / max(t_both - t_only, 1e-3) / 1e3, "GB/s")
        add(system, "ll", "dispatch_host", t, h_d, "us")
        add(system, "ll", "combine_host", t, h_c, "us")
        add(system, "ll", "dispatch_gpu_latency", t, g_only, "us")
        add(system, "ll", "combine_gpu_latency", t, g_both - g_only, "us")
        if system == "ibgda-ep" and a.nic_csv:
            link = a.nic_link_gbps / 8 * 1e3
            # Low latency sends one copy per (token, expert) pair on another rank, not per rank.
            per_rank = a.experts // world
            ll_pairs = int(((idx >= 0) & (idx // per_rank != rank)).sum())
            for what, nbytes, t_meas in (("dispatch", ll_pairs * (a.hidden + a.hidden / 128 * 4 + 16), t_only),
                                         ("combine", ll_pairs * a.hidden * 2, t_both - t_only)):
                nic_rows.append(("ll", f"{what}_nic_bytes", t, nbytes, "bytes"))
                model = nbytes / link + 2 * a.nic_latency_us
                nic_rows.append(("ll", f"{what}_nic_link_fraction", t, model / max(t_meas, 1e-3), "of the modelled time"))
    if rank == 0:
        print(f"bench_ep: {world} ranks, num_sms {a.num_sms}; " + "; ".join(notes))
        for r in rows:
            print(f"  {r[0]:9} {r[1]:2} {r[2]:17} tokens={r[3]:5}  {r[4]:10.2f} {r[5]}")
        if a.csv:
            new = not os.path.exists(a.csv)
            with open(a.csv, "a") as f:
                if new:
                    f.write("system,mode,metric,tokens,value,unit\n")
                for r in rows:
                    f.write(f"{r[0]},{r[1]},{r[2]},{r[3]},{r[4]:.3f},{r[5]}\n")
        if a.nic_csv:
            transport = os.environ.get("IBGDA_TRANSPORT", "auto")
            new = not os.path.exists(a.nic_csv)
            with open(a.nic_csv, "a") as f:
                if new:
                    f.write("system,transport,mode,metric,tokens,value,unit\n")
                for r in rows:
                    if r[0] == "ibgda-ep":
                        f.write(f"{r[0]},{transport},{r[1]},{r[2]},{r[3]},{r[4]:.3f},{r[5]}\n")
                for r in nic_rows:
                    f.write(f"ibgda-ep,{transport},{r[0]},{r[1]},{r[2]},{r[3]:.4f},{r[4]}\n")
                    print(f"  ibgda-ep  {transport:6} {r[0]:2} {r[1]:28} tokens={r[2]:5}  {r[3]:12.4f} {r[4]}")
    if "ibgda-ep" in bufs:
        bufs["ibgda-ep"].destroy()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
