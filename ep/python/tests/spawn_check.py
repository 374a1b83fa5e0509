"""Ranks started by ``torch.multiprocessing.spawn`` (no launcher variables), as DeepEP's own test
scripts start them: each joins a process group, then ``Buffer(group)`` takes its place in the job
from the group, and a dispatch and combine run and are checked. Run by test_ep.py on the CPU
emulation; prints one line per rank."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Before CUDA starts in any process (spawned ranks import this module first): over the emulated
# NIC it chooses eager module loading.
from ibgda_ep import Buffer, topk_idx_t


def rank_main(rank: int, world: int, port: int) -> None:
    on_gpu = torch.cuda.is_available() and os.environ.get("IBGDA_DEVICE", "").lower() != "cpu"
    if on_gpu:
        # As DeepEP's scripts do: one GPU per spawned rank, chosen before the group.
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    assert Buffer.is_sm90_compiled()
    assert "RANK" not in os.environ or os.environ["RANK"] == str(rank)
    hidden, tokens, experts, topk = 128, 16, 4 * world, 2
    buf = Buffer(dist.group.WORLD, Buffer.get_ht_buffer_size_hint(tokens, hidden, world, topk), 0)
    assert (buf.rank, buf.group_size) == (rank, world), (buf.rank, buf.group_size)
    g = torch.Generator().manual_seed(7 + rank)
    dev = buf.device
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(dev)
    topk_idx = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(tokens)]).to(topk_idx_t).to(dev)
    weights = torch.ones(tokens, topk, dtype=torch.float32, device=dev)
    n_rank, _, n_expert, in_rank, _ = buf.get_dispatch_layout(topk_idx, experts)
    # DeepEP's calling conventions: a recommended config, an event captured before the call.
    recv_x, recv_idx, recv_w, _, handle, _ = buf.dispatch(
        x, num_tokens_per_rank=n_rank, is_token_in_rank=in_rank, num_tokens_per_expert=n_expert,
        topk_idx=topk_idx, topk_weights=weights, config=Buffer.get_dispatch_config(world),
        previous_event=Buffer.capture())
    # Every rank sends back what it received, unchanged: each token comes home summed over the
    # ranks it went to.
    out, _, _ = buf.combine(recv_x, handle, config=Buffer.get_combine_config(world))
    want = x.float() * in_rank.sum(dim=1, keepdim=True).float()
    assert torch.allclose(out.float(), want, rtol=2e-2, atol=2e-2), (out.float() - want).abs().max()
    if on_gpu:
        torch.cuda.current_stream().synchronize()
    buf.destroy()
    dist.destroy_process_group()
    print(f"spawn_check: rank {rank}/{world} OK on {dev}", flush=True)


if __name__ == "__main__":
    world, port = int(sys.argv[1]), int(sys.argv[2])
    mp.spawn(rank_main, args=(world, port), nprocs=world, join=True)
