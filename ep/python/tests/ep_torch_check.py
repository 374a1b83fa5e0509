"""Per-rank correctness check of ibgda_ep under a launcher (torchrun / ibgda-run):
high-throughput and low-latency dispatch and combine, BF16 and FP8, against a plain torch
reference; a CUDA-graph capture and replay of low-latency dispatch+combine on GPUs; and every
bad input of the API raising ValueError. Exits non-zero on the first failure."""

import os
import sys

import torch

import ibgda_ep
from ibgda_ep import Buffer

HIDDEN, TOPK, MAXT = 256, 4, 32
SIDE_STREAM = None


def inputs(rank, world, experts, seed, device, mode="random"):
    g = torch.Generator().manual_seed(seed * 131 + rank)
    t = int(torch.randint(1, MAXT + 1, (1,), generator=g)) if not (mode == "random" and rank == world - 1 and seed % 2) else 0
    idx = torch.full((t, TOPK), -1, dtype=torch.int64)
    for i in range(t):
        if mode == "rank0":
            perm = torch.randperm(experts // world, generator=g)[:TOPK]
        else:
            perm = torch.randperm(experts, generator=g)[:TOPK]
        keep = torch.rand(TOPK, generator=g) > 0.15
        idx[i] = torch.where(keep, perm, torch.full_like(perm, -1))
    w = torch.rand((t, TOPK), generator=g)
    x = (torch.rand((t, HIDDEN), generator=g) * 8 - 4).to(torch.bfloat16)
    return idx.to(device), w.to(device), x.to(device)


def per_token_cast_to_fp8(x):
    t, h = x.shape
    xv = x.float().view(t, h // 128, 128)
    amax = xv.abs().amax(dim=2).clamp(min=1e-4)
    q = (xv * (448.0 / amax.unsqueeze(2))).to(torch.float8_e4m3fn).view(t, h)
    return q, amax / 448.0


def dequant(q, s):
    t, h = q.shape
    return (q.float().view(t, h // 128, 128) * s.unsqueeze(2)).view(t, h)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def ht_round(buf, rank, world, experts, seed, fp8, mode):
    dev = buf.device
    local = experts // world
    all_in = [inputs(r, world, experts, seed, "cpu", mode) for r in range(world)]
    idx, w, x = [a.to(dev) for a in all_in[rank]]
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, experts)
    ref_in = torch.zeros((idx.shape[0], world), dtype=torch.bool)
    for r in range(world):
        ref_in[:, r] = ((idx.cpu() >= r * local) & (idx.cpu() < (r + 1) * local)).any(dim=1)
    check(torch.equal(in_rank.cpu(), ref_in), "is_token_in_rank")
    check(torch.equal(per_rank.cpu(), ref_in.sum(0).int()), "num_tokens_per_rank")
    ref_e = torch.bincount(idx.cpu()[idx.cpu() >= 0], minlength=experts).int()
    check(torch.equal(per_expert.cpu(), ref_e), "num_tokens_per_expert")
    xin = per_token_cast_to_fp8(x) if fp8 else x
    recv_x, recv_idx, recv_w, counts, handle, ev = buf.dispatch(
        xin, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=idx, topk_weights=w)
    # Reference: sources in order, their tokens with an expert here in order.
    rows = []
    for s in range(world):
        si, _, sx = all_in[s]
        for t in range(si.shape[0]):
            if ((si[t] >= rank * local) & (si[t] < (rank + 1) * local)).any():
                rows.append((s, t))
    check(handle.num_recv == len(rows), f"received {handle.num_recv} rows, reference {len(rows)}")
    want_counts = [int(sum((all_in[s][0] == rank * local + e).sum() for s in range(world))) for e in range(local)]
    check(counts == want_counts, f"per-expert counts {counts} vs {want_counts}")
    if rows:
        rx = recv_x[0] if fp8 else recv_x
        ref_x = torch.stack([all_in[s][2][t] for s, t in rows])
        if fp8:
            q, sc = per_token_cast_to_fp8(ref_x)
            got = dequant(rx.cpu(), recv_x[1].cpu())
            check(torch.allclose(got, dequant(q, sc), rtol=0.07, atol=1e-2), "fp8 payload")
        else:
            check(torch.equal(rx.cpu(), ref_x), "bf16 payload")
        ref_idx = torch.stack([all_in[s][0][t] for s, t in rows])
        mine = (ref_idx >= rank * local) & (ref_idx < (rank + 1) * local)
        check(torch.equal(recv_idx.cpu(), torch.where(mine, ref_idx - rank * local, -1)), "recv_topk_idx")
        ref_w = torch.stack([all_in[s][1][t] for s, t in rows])
        check(torch.equal(recv_w.cpu(), torch.where(mine, ref_w, 0.0)), "recv_topk_weights")
    # Experts: expert e scales by (e+1)/4; each rank sends the weighted sum of its experts.
    xf = dequant(*recv_x).to(dev) if fp8 else recv_x.float()
    scale = torch.where(recv_idx >= 0, recv_w * (recv_idx + 1).float() / 4, 0.0).sum(1, keepdim=True)
    y = (xf * scale).to(torch.bfloat16)
    combined, combined_w, _ = buf.combine(y, handle, topk_weights=recv_w)
    xs = dequant(*per_token_cast_to_fp8(x)) if fp8 else x.float()
    ref = torch.zeros_like(xs)
    for r in range(world):
        m = (idx >= r * local) & (idx < (r + 1) * local)
        sc = torch.where(m, w * ((idx - r * local) + 1).float() / 4, 0.0).sum(1, keepdim=True)
        ref += (xs * sc).to(torch.bfloat16).float()
    check(torch.allclose(combined.float(), ref, rtol=2e-2, atol=2e-2), "combine")
    check(torch.allclose(combined_w, torch.where(idx >= 0, w, 0.0)), "combined_topk_weights")
    # Cached dispatch: same rows without the layout.
    again = buf.dispatch(xin, handle=handle)[0]
    check(torch.equal((again[0] if fp8 else again).view(torch.uint8).cpu(), (recv_x[0] if fp8 else recv_x).view(torch.uint8).cpu()), "cached dispatch")
    buf.combine(y, handle)
    return len(rows)


def ll_round(buf, rank, world, experts, seed, fp8, hook=False):
    dev = buf.device
    local = experts // world
    idx, w, x = [a.to(dev) for a in inputs(rank, world, experts, seed, "cpu")]
    stats = torch.full((local,), 5, dtype=torch.int32, device=dev)
    recv_x, count, handle, ev, recv_hook = buf.low_latency_dispatch(x, idx, MAXT, experts, use_fp8=fp8, return_recv_hook=hook,
                                                                    cumulative_local_expert_recv_stats=stats)
    recv_hook()
    if dev.type == "cuda":
        torch.cuda.current_stream().wait_stream(buf._comm)
    check(torch.equal(stats.cpu(), count.cpu() + 5), f"cumulative_local_expert_recv_stats {stats.tolist()} vs 5 + {count.tolist()}")
    all_in = [inputs(r, world, experts, seed, "cpu") for r in range(world)]
    for e in range(local):
        want = sum(int((all_in[s][0] == rank * local + e).sum()) for s in range(world))
        check(int(count[e]) == want, f"expert {e}: {int(count[e])} tokens vs {want}")
    # The handle as DeepEP's tuple: each source rank's rows (offset << 32 | count) hold exactly
    # the tokens of that rank that chose the expert.
    src_tok, layout, max_tokens, hidden, num_experts = handle
    check((max_tokens, hidden, num_experts) == (MAXT, x.shape[1], experts), "handle's sizes")
    src_tok, layout, mask = src_tok.cpu(), layout.cpu(), (1 << 32) - 1
    for e in range(local):
        check(int((layout[e] & mask).sum()) == int(count[e]), f"expert {e}: layout_range counts")
        for s in range(world):
            begin, n = int(layout[e, s]) >> 32, int(layout[e, s]) & mask
            got = sorted(src_tok[e, begin:begin + n].tolist())
            want = sorted((all_in[s][0] == rank * local + e).any(dim=1).nonzero().flatten().tolist())
            check(got == want, f"expert {e} from rank {s}: source tokens {got} vs {want}")
    xf = dequant(recv_x[0].view(-1, x.shape[1]), recv_x[1].view(-1, x.shape[1] // 128)).view(recv_x[0].shape) if fp8 else recv_x.float()
    y = (xf * (torch.arange(local, device=dev).float().view(-1, 1, 1) + 1) / 4).to(torch.bfloat16)
    out, _, combine_hook = buf.low_latency_combine(y, idx, w, handle, return_recv_hook=hook)
    combine_hook()
    xs = dequant(*per_token_cast_to_fp8(x)) if fp8 else x.float()
    ref = torch.zeros_like(xs)
    for k in range(TOPK):
        e = idx[:, k]
        ref += torch.where((e >= 0).unsqueeze(1), w[:, k:k + 1] * (xs * ((e % local) + 1).float().unsqueeze(1) / 4).to(torch.bfloat16).float(), 0.0)
    # FP8: the kernels' e4m3 rounding may differ from torch's by one code (relative 1/8) per element.
    tol = (xs.abs() * w.sum(1, keepdim=True) * local / 4 / 8 + 0.05) if fp8 else (ref.abs() * 2e-2 + 2e-2)
    err = (out.float() - ref).abs()
    check(bool((err <= tol).all()), f"low-latency combine (fp8={fp8}): max error {err.max().item() if err.numel() else 0}")
    # Zero-copy (DeepEP's): the outputs written into the buffer's next combine input, x unread.
    buf.get_next_low_latency_combine_buffer(handle)[:, :, :] = y
    out2, _, _ = buf.low_latency_combine(torch.zeros_like(y), idx, w, handle, zero_copy=True)
    # The same sums (their order of accumulation may differ from the first combine's).
    err2 = (out2.float() - ref).abs()
    check(bool((err2 <= tol).all()), f"zero-copy low-latency combine: max error {err2.max().item() if err2.numel() else 0}")
    return int(count.sum())


def ll_scale_round(buf, rank, world, experts, seed):
    """DeepEP's round_scale and use_ue8m0: the same codes with scales rounded up to powers of two,
    then those scales as UE8M0 exponent bytes (four per int32)."""
    dev = buf.device
    local = experts // world
    idx = inputs(rank, world, experts, seed, "cpu")[0].to(dev)
    t, h = idx.shape[0], 512
    # Every rank's x is the same (one seed), so a received row is x[its source token].
    x_all = (torch.rand((MAXT, h), generator=torch.Generator().manual_seed(seed)) * 8 - 4).to(torch.bfloat16).to(dev)
    x = x_all[:t]
    # Another hidden size: another layout of the low-latency area, which needs a clean first.
    expect_error("another layout without a clean", lambda: buf.low_latency_dispatch(x, idx, MAXT, experts, use_fp8=True),
                 "clean_low_latency_buffer")
    buf.clean_low_latency_buffer(MAXT, h, experts)
    plain = buf.low_latency_dispatch(x, idx, MAXT, experts, use_fp8=True)
    rounded = buf.low_latency_dispatch(x, idx, MAXT, experts, use_fp8=True, round_scale=True)
    packed = buf.low_latency_dispatch(x, idx, MAXT, experts, use_fp8=True, round_scale=True, use_ue8m0=True)
    check(packed[0][1].dtype == torch.int32 and packed[0][1].shape[-1] == h // 512, "UE8M0 scales are int32 [.., hidden/512]")
    mask = (1 << 32) - 1

    def by_source(d, e, n):
        """Row order by (source rank, token): rows of one expert arrive in any order."""
        tokens, layout = d[2][0][e][:n].long(), d[2][1][e]
        src = torch.empty(n, dtype=torch.long, device=dev)
        for s in range(world):
            b, c = int(layout[s]) >> 32, int(layout[s]) & mask
            src[b:b + c] = s
        return torch.argsort(src * MAXT + tokens), tokens

    for e in range(local):
        n = int(plain[1][e])
        check(int(rounded[1][e]) == n and int(packed[1][e]) == n, "the same rows arrive")
        if n == 0:
            continue
        (op, _), (orr, tok), (opk, _) = by_source(plain, e, n), by_source(rounded, e, n), by_source(packed, e, n)
        sp, sr = plain[0][1][e, :n][op], rounded[0][1][e, :n][orr]
        check(bool(((sr.view(torch.int32) & 0x7FFFFF) == 0).all()), "rounded scales are powers of two")
        check(bool(((sr >= sp) & (sr < 2 * sp)).all()), "a rounded scale is the next power of two up")
        exps = packed[0][1][e, :n][opk].contiguous().view(torch.uint8).to(torch.int32)
        check(torch.equal((exps << 23).view(torch.float32).cpu(), sr.cpu()), "UE8M0 bytes are the rounded scales' exponents")
        check(torch.equal(packed[0][0][e, :n][opk].view(torch.uint8).cpu(), rounded[0][0][e, :n][orr].view(torch.uint8).cpu()),
              "UE8M0 and rounded scales quantise alike")
        tok = tok[orr]
        got = dequant(rounded[0][0][e, :n][orr], sr)
        ref = x_all[tok].float()
        check(bool(((got - ref).abs() <= ref.abs() / 8 + sr.repeat_interleave(128, dim=1) * 2).all()), "rounded-scale payload")
    buf.clean_low_latency_buffer(MAXT, HIDDEN, experts)
    return 0


def graph_round(buf, rank, world, experts):
    """Capture low-latency dispatch + combine in a CUDA graph and replay it with new data."""
    dev = buf.device
    local = experts // world
    idx, w, x = [a.to(dev) for a in inputs(rank, world, experts, 5, "cpu")]
    static_x = x.clone()

    def step():
        rx, cnt, h, _, _ = buf.low_latency_dispatch(static_x, idx, MAXT, experts, use_fp8=False)
        y = (rx.float() * 2).to(torch.bfloat16)
        return buf.low_latency_combine(y, idx, w, h)[0]

    s = SIDE_STREAM or torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    # capture_begin/end on a side stream rather than `with torch.cuda.graph()`, whose entry
    # synchronises the whole device: with IBGDA the emulated NIC's engine kernel never ends.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        graph.capture_begin()
        out = step()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    for rep in range(3):
        static_x.copy_((torch.rand_like(x.float()) * 4 - 2).to(torch.bfloat16))
        graph.replay()
        # Stream, not device: with IBGDA the emulated NIC's engine kernel never ends.
        torch.cuda.current_stream().synchronize()
        ref = (static_x.float() * 2).to(torch.bfloat16).float() * torch.where(idx >= 0, w, 0.0).sum(1, keepdim=True)
        check(torch.allclose(out.float(), ref, rtol=3e-2, atol=3e-2), f"graph replay {rep}")


def expect_error(what, fn, needle):
    try:
        fn()
    except (ValueError, TypeError) as e:
        check(needle in str(e), f"{what}: message {e!r} lacks {needle!r}")
        return
    raise AssertionError(f"{what}: no error")


def bad_inputs(buf, rank, world, experts):
    dev = buf.device
    idx, w, x = [a.to(dev) for a in inputs(rank, world, experts, 3, "cpu")]
    t = 4
    idx = torch.zeros((t, TOPK), dtype=torch.int64, device=dev)
    ww = torch.zeros((t, TOPK), device=dev)
    # An expert out of range in rank 0's routing: the layout counts it nowhere (no host
    # synchronisation), the dispatch's notify finds it on the GPU and every rank raises.
    bad = idx.clone()
    if rank == 0:
        bad[1, 2] = experts
        bad[3, 0] = -2
    x0 = torch.zeros((t, 256), dtype=torch.bfloat16, device=dev)
    pr_b, _, pe_b, ir_b, _ = buf.get_dispatch_layout(bad, experts)
    expect_error("expert out of range", lambda: buf.dispatch(x0, num_tokens_per_rank=pr_b, is_token_in_rank=ir_b,
                 num_tokens_per_expert=pe_b, topk_idx=bad, topk_weights=ww),
                 "token 1" if rank == 0 else "rank 0's topk_idx of token 1")
    # The buffer is still usable: the same call with good routing (every token to expert 0).
    pr_g, _, pe_g, ir_g, _ = buf.get_dispatch_layout(idx, experts)
    rx, _, _, _, h_good, _ = buf.dispatch(x0, num_tokens_per_rank=pr_g, is_token_in_rank=ir_g, num_tokens_per_expert=pe_g,
                                          topk_idx=idx, topk_weights=ww)
    check(rx.shape[0] == (t * world if rank == 0 else 0), f"after a bad dispatch: {rx.shape[0]} rows received")
    # Rank 0 receives every rank's tokens: one row more than num_worst_tokens stops the call on
    # every rank, non-cached (the count exchange finds it) and cached (the handle's matrix).
    who = "this rank receives" if rank == 0 else "rank 0 receives"
    expect_error("num_worst_tokens too small", lambda: buf.dispatch(x0, num_tokens_per_rank=pr_g, is_token_in_rank=ir_g,
                 num_tokens_per_expert=pe_g, topk_idx=idx, topk_weights=ww, num_worst_tokens=t * world - 1),
                 f"{who} {t * world} rows, more than num_worst_tokens ({t * world - 1})")
    expect_error("num_worst_tokens too small, cached", lambda: buf.dispatch(x0, handle=h_good, num_worst_tokens=t * world - 1),
                 f"{who} {t * world} rows")
    # The buffer is still usable, with a limit the call meets (every rank's outputs padded to it).
    rx, _, _, _, _, _ = buf.dispatch(x0, num_tokens_per_rank=pr_g, is_token_in_rank=ir_g, num_tokens_per_expert=pe_g,
                                     topk_idx=idx, topk_weights=ww, num_worst_tokens=t * world)
    check(rx.shape[0] == t * world, f"after num_worst_tokens errors: {rx.shape[0]} rows")
    rx, _, _, _, _, _ = buf.dispatch(x0, handle=h_good, num_worst_tokens=t * world)
    check(rx.shape[0] == t * world, f"cached, after num_worst_tokens errors: {rx.shape[0]} rows")
    expect_error("wrong dtype", lambda: buf.get_dispatch_layout(idx.int(), experts), "torch.int64")
    other = torch.device("meta") if dev.type == "cpu" else torch.device("cpu")
    expect_error("wrong device", lambda: buf.get_dispatch_layout(idx.to(other), experts), "is on")
    x = torch.zeros((t, 136), dtype=torch.bfloat16, device=dev)
    xq = x.to(torch.float8_e4m3fn)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, experts)
    expect_error("fp8 hidden not a multiple of 128", lambda: buf.dispatch((xq, torch.zeros((t, 1), device=dev)), num_tokens_per_rank=per_rank,
                 is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=ww), "multiple of 128")
    expect_error("wrong shape", lambda: buf.dispatch(torch.zeros((t, 256), dtype=torch.bfloat16, device=dev), num_tokens_per_rank=per_rank,
                 is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=ww[:, :2]), "shape")
    expect_error("too many tokens (low latency)", lambda: buf.low_latency_dispatch(torch.zeros((MAXT + 1, 256), dtype=torch.bfloat16, device=dev),
                 torch.zeros((MAXT + 1, TOPK), dtype=torch.int64, device=dev), MAXT, experts), "num_max_dispatch_tokens_per_rank")
    # A config that is not a Config.
    from ibgda_ep import Config
    expect_error("config not a Config", lambda: buf.dispatch(torch.zeros((t, 256), dtype=torch.bfloat16, device=dev),
                 num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=idx,
                 topk_weights=ww, config={"num_sms": 20}), "ibgda_ep.Config")
    expect_error("odd chunks", lambda: Config(20, 8, 4), "receive >= send")
    # A handle from another buffer.
    x2 = torch.zeros((t, 256), dtype=torch.bfloat16, device=dev)
    _, _, h, _, _ = buf.low_latency_dispatch(x2, idx, MAXT, experts, use_fp8=False)
    other_buf = Buffer(None, 1 << 20, Buffer.get_low_latency_rdma_size_hint(MAXT, 256, world, experts))
    expect_error("foreign handle", lambda: other_buf.low_latency_combine(torch.zeros((experts // world, world * MAXT, 256), dtype=torch.bfloat16, device=dev), idx, ww, h), "another Buffer")
    buf.low_latency_combine(torch.zeros((experts // world, world * MAXT, 256), dtype=torch.bfloat16, device=dev), idx, ww, h)
    # More tokens than the high-throughput area holds: every rank raises.
    small = Buffer(None, Buffer.get_ht_buffer_size_hint(2, 256, world, TOPK), 1 << 16)
    many = torch.zeros((16, TOPK), dtype=torch.int64, device=dev)
    pr, _, pe_, ir, _ = small.get_dispatch_layout(many, experts)
    expect_error("buffer too small", lambda: small.dispatch(torch.zeros((16, 256), dtype=torch.bfloat16, device=dev), num_tokens_per_rank=pr,
                 is_token_in_rank=ir, num_tokens_per_expert=pe_, topk_idx=many, topk_weights=torch.zeros((16, TOPK), device=dev)), "num_nvl_bytes")
    # A cached dispatch of wider rows than its handle's fills fewer slots: every rank raises before
    # anything moves (the handle's matrix), and the buffer stays usable.
    two = torch.zeros((2, TOPK), dtype=torch.int64, device=dev)
    pr, _, pe_, ir, _ = small.get_dispatch_layout(two, experts)
    x256 = torch.zeros((2, 256), dtype=torch.bfloat16, device=dev)
    _, _, _, _, h_two, _ = small.dispatch(x256, num_tokens_per_rank=pr, is_token_in_rank=ir, num_tokens_per_expert=pe_,
                                          topk_idx=two, topk_weights=torch.zeros((2, TOPK), device=dev))
    expect_error("cached dispatch too wide", lambda: small.dispatch(torch.zeros((2, 512), dtype=torch.bfloat16, device=dev),
                 handle=h_two), "more tokens for rank 0 than the buffer holds")
    rx = small.dispatch(x256, handle=h_two)[0]
    check(rx.shape[0] == (2 * world if rank == 0 else 0), f"cached, after the too-wide one: {rx.shape[0]} rows")
    small.destroy()
    other_buf.destroy()


def deepep_intranode_round(buf, rank, world, experts, seed):
    """The calls DeepEP's own test_intranode.py makes: a dispatch without top-k (rows go where
    is_token_in_rank says), the handle read as DeepEP's tuple (rank_prefix_matrix orders the rows
    by source), a cached dispatch, a combine without weights, FP8 scales passed column-major, and
    num_worst_tokens padding."""
    dev = buf.device
    local = experts // world
    all_in = [inputs(r, world, experts, seed, "cpu") for r in range(world)]
    idx, w, _ = [a.to(dev) for a in all_in[rank]]
    # Every rank's rows are its rank number, as DeepEP's check_data needs.
    x = torch.full((idx.shape[0], HIDDEN), float(rank), dtype=torch.bfloat16, device=dev)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, experts)
    ref_sent = torch.zeros((world, world), dtype=torch.int32)
    for s in range(world):
        si = all_in[s][0]
        for r in range(world):
            ref_sent[s, r] = int(((si >= r * local) & (si < (r + 1) * local)).any(dim=1).sum())
    for xin in (x, (lambda q, sc: (q, sc.T.contiguous().T))(*per_token_cast_to_fp8(x))):
        fp8 = isinstance(xin, tuple)
        recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
            xin, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
        check(recv_idx is None and recv_w is None, "dispatch without top-k returns no top-k")
        check(len(handle) == 6, "DeepEP's intranode handle has 6 items")
        prefix = handle[0]
        check(torch.equal(prefix.cpu(), ref_sent.cumsum(0).int()), f"rank_prefix_matrix {prefix.tolist()} vs {ref_sent.cumsum(0).tolist()}")
        rx = dequant(*recv_x) if fp8 else recv_x.float()
        check(rx.shape[0] == int(ref_sent[:, rank].sum()), "rows received")
        start = 0
        for s in range(world):
            end = int(prefix[s][rank])
            check(bool(((rx[start:end] - s).abs() < 1e-3).all()), f"rows {start}..{end} come from rank {s}")
            start = end
        check(handle[3] is not None and handle[3].shape[0] == rx.shape[0], "recv_src_idx")
        again = buf.dispatch(xin, handle=handle)[0]
        check(torch.equal((dequant(*again) if fp8 else again.float()).cpu(), rx.cpu()), "cached dispatch without top-k")
        combined, combined_w, _ = buf.combine((dequant(*recv_x) if fp8 else recv_x.float()).to(torch.bfloat16), handle)
        check(combined_w is None, "no weights combined")
        want = x.float() * in_rank.sum(dim=1, keepdim=True).float()
        check(torch.allclose(combined.float(), want), "combine without top-k sums each token's rows")
    # A config of its own per call (DeepEP's tuning loops): the same rows on 3 SMs, combined on 5.
    from ibgda_ep import Config
    base_x = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    other = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                         config=Config(3))
    check(torch.equal(other[0].cpu(), base_x[0].cpu()), "dispatch on another SM count")
    out, _, _ = buf.combine(other[0], other[4], config=Config(5))
    check(torch.allclose(out.float(), x.float() * in_rank.sum(dim=1, keepdim=True).float()), "combine on another SM count")
    # num_worst_tokens: DeepEP's fixed shapes (every rank's tokens), padding with top-k index -1.
    worst = MAXT * world
    base = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                        topk_idx=idx, topk_weights=w)
    padded = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                          topk_idx=idx, topk_weights=w, num_worst_tokens=worst)
    n = base[0].shape[0]
    check(padded[3] == [], "no per-expert counts with num_worst_tokens")
    check(padded[0].shape[0] == worst and padded[1].shape[0] == worst and padded[2].shape[0] == worst, "worst-case shapes")
    check(torch.equal(padded[0][:n].cpu(), base[0].cpu()) and torch.equal(padded[1][:n].cpu(), base[1].cpu()), "worst-case rows")
    check(bool((padded[1][n:] == -1).all()), "padding rows have top-k index -1")
    out, _, _ = buf.combine(padded[0], padded[4])
    check(torch.allclose(out.float(), x.float() * in_rank.sum(dim=1, keepdim=True).float()), "combine of padded rows")
    return int(ref_sent[:, rank].sum())


def failed_allocation_round(buf, rank, world, experts, seed):
    """A dispatch whose outputs cannot be allocated after its send kernel ran (out of memory)
    raises that error on every rank, and the buffer stays usable: the round after it is checked."""
    dev = buf.device
    idx, w, x = [a.to(dev) for a in inputs(rank, world, experts, seed, "cpu")]
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, experts)
    hidden, real = x.shape[1], buf._empty

    def failing(shape, dtype):
        if len(shape) == 2 and shape[1] == hidden and dtype == torch.bfloat16:
            raise RuntimeError("injected: out of memory for recv_x")
        return real(shape, dtype)

    buf._empty = failing
    try:
        buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                     topk_idx=idx, topk_weights=w)
    except RuntimeError as e:
        check("injected" in str(e), f"failed allocation: {e!r}")
    else:
        raise AssertionError("failed allocation: no error")
    finally:
        del buf._empty
    return ht_round(buf, rank, world, experts, seed + 1, False, "random")


def main():
    if os.environ.get("IBGDA_EP_STACK_DUMP_S"):  # diagnosis: every thread's Python stack after N s
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["IBGDA_EP_STACK_DUMP_S"]), exit=False)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if torch.cuda.is_available() and os.environ.get("IBGDA_DEVICE", "auto") != "cpu":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    global SIDE_STREAM
    if os.environ.get("IBGDA_EP_EARLY_STREAM") and torch.cuda.is_available():
        SIDE_STREAM = torch.cuda.Stream()  # made before the Buffer (and the emulated NIC) starts
    experts = 4 * world
    Buffer.set_num_sms(4)
    buf = Buffer(None, Buffer.get_ht_buffer_size_hint(MAXT, HIDDEN, world, TOPK),
                 Buffer.get_low_latency_rdma_size_hint(MAXT, 2 * HIDDEN, world, experts))
    rows = 0
    for seed in range(2):
        for fp8 in (False, True):
            for mode in ("random", "rank0"):
                rows += ht_round(buf, rank, world, experts, seed * 10 + 1, fp8, mode)
            rows += ll_round(buf, rank, world, experts, seed * 10 + 2, fp8, hook=(seed == 1))
        rows += deepep_intranode_round(buf, rank, world, experts, seed * 10 + 3)
        rows += failed_allocation_round(buf, rank, world, experts, seed * 10 + 5)
        ll_scale_round(buf, rank, world, experts, seed * 10 + 4)
    graph = "skipped (CPU emulation)"
    if buf.device.type == "cuda":
        graph_round(buf, rank, world, experts)
        graph = "ok"
    bad_inputs(buf, rank, world, experts)
    print(f"ep_torch_check: rank {rank}/{world} on {buf.device} transports {buf.transports()}: "
          f"{rows} rows checked, bad inputs ok, cuda graph {graph}", flush=True)
    buf.destroy()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line per rank, then a non-zero exit
        print(f"ep_torch_check: rank {os.environ.get('RANK', '0')} FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise
