"""ibgda_ep: MoE expert-parallel dispatch and combine with DeepEP V1's ``Buffer`` API.

Switch from DeepEP by changing the import::

    from ibgda_ep import Buffer          # was: from deep_ep import Buffer

Runs one process per GPU under ``torchrun`` (rank and world from the environment, checked
against ``group``), on the GPU's current CUDA stream; without a GPU (or with
``IBGDA_DEVICE=cpu``) the same calls run on the CPU emulation with CPU tensors.
Same-node peers use NVLink stores; ``IBGDA_TRANSPORT=ibgda|proxy`` forces the NIC paths.
"""

from __future__ import annotations

import os
from typing import Callable, List, Optional, Tuple, Union

import torch

from ._native import Runtime

__all__ = ["Buffer", "Config", "EventOverlap", "DispatchHandle", "LowLatencyHandle", "topk_idx_t"]

_FP8 = getattr(torch, "float8_e4m3fn", None)


def _uses_emulated_nic() -> bool:
    """Whether ``IBGDA_TRANSPORT`` sends some peer through the emulated NIC (IBGDA or the proxy)."""
    t = os.environ.get("IBGDA_TRANSPORT", "").lower()
    return "ibgda" in t or "proxy" in t


def _module_loading() -> str:
    """CUDA_MODULE_LOADING as the CUDA libraries see it: the C environment, which PyTorch's C++
    sets (to LAZY) when it starts CUDA without updating Python's ``os.environ``."""
    import ctypes
    try:
        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_char_p
        v = libc.getenv(b"CUDA_MODULE_LOADING")
        return v.decode() if v else "LAZY"
    except (OSError, AttributeError):
        return os.environ.get("CUDA_MODULE_LOADING", "LAZY")


# On a GPU the emulated NIC is a kernel that runs until the buffer is destroyed. CUDA's lazy
# module loading loads each PyTorch kernel at its first launch, and a module load waits for the
# running kernels of the context: it would wait for the NIC forever. Eager loading avoids it; it
# must be chosen before CUDA starts, so it is set here, at import, when the NIC will be used (a
# process that started CUDA first gets an error from Buffer() instead of a hang).
if _uses_emulated_nic() and "CUDA_MODULE_LOADING" not in os.environ and not torch.cuda.is_initialized():
    os.environ["CUDA_MODULE_LOADING"] = "EAGER"


_WARMED_UP = False


def _warm_up_cuda() -> None:
    """Runs, once per process, PyTorch work of the kinds whose first use makes the driver wait for
    the GPU to go idle (a first kernel that needs local memory, a first device-to-host copy, a
    first stream): done after the emulated NIC's engine kernel has started, that wait would never
    end (seen on H200s: the first reduction, the first ``torch.rand`` with a CUDA generator and a
    first ``torch.cuda.Stream()`` hung). Work of a kind not covered here can still hang there:
    run it once before creating the Buffer."""
    global _WARMED_UP
    if _WARMED_UP:
        return
    dev = torch.device("cuda", torch.cuda.current_device())
    z = torch.zeros((64, 8), dtype=torch.int64, device=dev)
    bool(((z < -1) | (z >= 8)).any())
    z.nonzero()
    z.sum().item()
    torch.bincount(z.flatten(), minlength=8).cumsum(0).argsort()
    gen = torch.Generator(device=dev).manual_seed(0)
    f = torch.rand((64, 256), device=dev, generator=gen) + torch.randn((64, 256), device=dev)
    torch.rand((64, 8), device=dev).normal_()
    torch.topk(f, 2, dim=1)
    f.softmax(1).amax(1).cpu()
    b = f.to(torch.bfloat16)
    (b @ b.t()).float().sum().item()
    if _FP8 is not None:
        b.float().to(_FP8).float()
    torch.zeros_like(f).index_add_(0, torch.arange(64, device=dev), f)
    torch.cat([f, f]).index_select(0, torch.arange(4, device=dev)).cpu()
    torch.cuda.Stream()
    torch.cuda.current_stream().synchronize()
    _WARMED_UP = True


class EventOverlap:
    """DeepEP's ``EventOverlap``: a CUDA event on the communication stream (``None`` on the CPU)."""

    def __init__(self, event: Optional["torch.cuda.Event"] = None):
        self.event = event

    def current_stream_wait(self) -> None:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.current_stream_wait()


#: PyTorch's raw current-stream accessor (private; absent in some builds, then the public API).
_raw_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

#: The kernels' packing of a received row's source: token index * this + top-k entry.
_MAX_TOPK = 16

#: The dtype of top-k expert indices (DeepEP's ``deep_ep.topk_idx_t``).
topk_idx_t = torch.int64


class Config:
    """DeepEP's high-throughput ``Config``: the SMs a dispatch or combine uses, and DeepEP's chunk
    sizes (tokens per NVLink and RDMA send and receive chunk). ibgda-ep's kernels take the SM count
    (``num_sms``, 1 to 128) and keep the chunk sizes only so that code written for DeepEP
    runs unchanged; they must be positive, with a receive chunk at least its send chunk."""

    def __init__(self, num_sms: int = 20, num_max_nvl_chunked_send_tokens: int = 6,
                 num_max_nvl_chunked_recv_tokens: int = 256, num_max_rdma_chunked_send_tokens: int = 6,
                 num_max_rdma_chunked_recv_tokens: int = 128):
        if not 1 <= num_sms <= 128:
            raise ValueError(f"Config: num_sms must be in 1..128, not {num_sms}")
        chunks = {"nvl": (num_max_nvl_chunked_send_tokens, num_max_nvl_chunked_recv_tokens),
                  "rdma": (num_max_rdma_chunked_send_tokens, num_max_rdma_chunked_recv_tokens)}
        for name, (send, recv) in chunks.items():
            if send <= 0 or recv < send:
                raise ValueError(f"Config: the {name} chunks must be positive, receive >= send (got {send}, {recv})")
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens, self.num_max_nvl_chunked_recv_tokens = chunks["nvl"]
        self.num_max_rdma_chunked_send_tokens, self.num_max_rdma_chunked_recv_tokens = chunks["rdma"]

    def __repr__(self) -> str:
        return (f"Config(num_sms={self.num_sms}, nvl=({self.num_max_nvl_chunked_send_tokens}, "
                f"{self.num_max_nvl_chunked_recv_tokens}), rdma=({self.num_max_rdma_chunked_send_tokens}, "
                f"{self.num_max_rdma_chunked_recv_tokens}))")


class DispatchHandle:
    """What a high-throughput ``dispatch`` returns for ``combine`` and cached dispatch.

    Indexed, it is DeepEP's intranode handle tuple ``(rank_prefix_matrix, channel_prefix_matrix,
    recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_head)``:
    ``rank_prefix_matrix[i][j]`` is the number of rows ranks ``0..=i`` send rank ``j`` (received
    rows are ordered by source rank, then token), ``recv_src_idx`` each received row's token on its
    source. ibgda-ep's kernels keep no per-channel prefix matrices or send heads: those items are
    ``None``."""

    def __init__(self, owner, geo, fp8, num_tokens, num_experts, info, send_slot, is_token_in_rank,
                 num_tokens_per_expert, recv_src_idx, num_recv, expert_counts, rows_sent):
        self.owner, self.geo, self.fp8 = owner, geo, fp8
        self.num_tokens, self.num_experts = num_tokens, num_experts
        self.info, self.send_slot = info, send_slot
        self.is_token_in_rank, self.num_tokens_per_expert = is_token_in_rank, num_tokens_per_expert
        self.recv_src_idx, self.num_recv, self.expert_counts = recv_src_idx, num_recv, expert_counts
        # Rows rank i sends rank j (row-major, the counts the host already read): the prefix
        # matrix is made from them only when asked for, since building a device tensor from the
        # host costs every non-cached dispatch a copy and several tensor operations.
        self._rows_sent, self._rank_prefix_matrix = rows_sent, None
        self._most_received = None
        self._most_sent_to = None

    def _most_sent(self):
        """``(rows, rank)``: the most rows one rank sends another in this handle's dispatch, and the
        first rank that receives that many (what a cached dispatch needs of the slots)."""
        if self._most_sent_to is None:
            r = self.owner.group_size
            most = max(self._rows_sent)
            self._most_sent_to = (most, self._rows_sent.index(most) % r)
        return self._most_sent_to

    def _most_received_by(self):
        """``(rows, rank)``: the most rows a rank receives in this handle's dispatch, and the first
        rank that receives them (every rank's handle holds the same matrix, so every rank finds
        the same)."""
        if self._most_received is None:
            r = self.owner.group_size
            totals = [sum(self._rows_sent[s * r + d] for s in range(r)) for d in range(r)]
            most = max(totals)
            self._most_received = (most, totals.index(most))
        return self._most_received

    @property
    def rank_prefix_matrix(self) -> torch.Tensor:
        """``i32 [R, R]`` on the buffer's device: rows ranks ``0..=i`` send rank ``j``. Made at
        the first read (a copy from the host), which must not be inside CUDA graph capture."""
        if self._rank_prefix_matrix is None:
            if self.owner.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"rank_prefix_matrix on rank {self.owner.rank}: first read inside CUDA graph "
                                   "capture; it is copied from the host when first read, so read it (or the "
                                   "handle's item 0) once before capturing")
            r = self.owner.group_size
            sent = torch.tensor(self._rows_sent, dtype=torch.int32).view(r, r)
            self._rank_prefix_matrix = sent.cumsum(0).to(torch.int32).to(self.owner.device)
        return self._rank_prefix_matrix

    def _ptrs(self):
        return (self.info.data_ptr(), self.send_slot.data_ptr(), self.is_token_in_rank.data_ptr(),
                self.num_tokens_per_expert.data_ptr())

    def _as_tuple(self):
        return (self.rank_prefix_matrix, None, None, self.recv_src_idx, self.is_token_in_rank, None)

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i):
        return self._as_tuple()[i]

    def __iter__(self):
        return iter(self._as_tuple())


class LowLatencyHandle:
    """What ``low_latency_dispatch`` returns for ``low_latency_combine``.

    Its device words live in one int32 tensor ``words`` (the dispatch's received counts first,
    then the sequence numbers, ``layout_range`` and ``src_info``): the kernels get their
    addresses from ``words.data_ptr()``, and the typed views (``seq``, ``src_info``,
    ``layout_range``) are made only when asked for, since each view costs the host a few
    microseconds per call."""

    def __init__(self, owner, geo, num_tokens, max_tokens, hidden, num_experts, words, at, ptrs=None):
        self.owner, self.geo, self.num_tokens, self.max_tokens = owner, geo, num_tokens, max_tokens
        self.hidden, self.num_experts = hidden, num_experts
        self.words, self._at = words, at  # at: int32 offsets of (seq, layout_range, src_info)
        self._ptr = ptrs if ptrs is not None else LowLatencyHandle.ptrs_of(words.data_ptr(), at)

    @staticmethod
    def ptrs_of(base: int, at) -> tuple:
        """The kernels' addresses of (seq, src_info, layout_range) in the words at ``base``."""
        return (base + 4 * at[0], base + 4 * at[2], base + 4 * at[1])

    def _ptrs(self):
        return self._ptr

    @property
    def seq(self) -> torch.Tensor:
        """``i64 [2]``: the dispatch's and the combine's sequence numbers."""
        return self.words[self._at[0]:self._at[0] + 4].view(torch.int64)

    @property
    def layout_range(self) -> torch.Tensor:
        """``i64 [local_experts, ranks]``: each source rank's rows as ``offset << 32 | count``."""
        r = self.owner.group_size
        local = self.num_experts // r
        return self.words[self._at[1]:self._at[2]].view(torch.int64).view(local, r)

    @property
    def src_info(self) -> torch.Tensor:
        """``i32 [local_experts, ranks * max_tokens]``: each received row's source token * 16 +
        top-k entry."""
        r = self.owner.group_size
        local = self.num_experts // r
        return self.words[self._at[2]:self._at[2] + local * r * self.max_tokens].view(local, r * self.max_tokens)

    # DeepEP's low-latency handle is the tuple (recv_src_info, recv_layout_range,
    # num_max_dispatch_tokens_per_rank, hidden, num_experts); scripts index it. recv_src_info
    # [local_experts, ranks * max_tokens] holds each received row's source token index,
    # recv_layout_range [local_experts, ranks] each source rank's rows as offset << 32 | count.
    def _as_tuple(self):
        tokens = torch.div(self.src_info, _MAX_TOPK, rounding_mode="floor")
        return (tokens, self.layout_range, self.max_tokens, self.hidden, self.num_experts)

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i):
        return self._as_tuple()[i]

    def __iter__(self):
        return iter(self._as_tuple())


def _env_int(*names: str) -> Optional[int]:
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    return None


def _join_group_if_not_launched(group, device: str) -> None:
    """Ranks started without a launcher's variables (``torch.multiprocessing.spawn``, as DeepEP's
    own test scripts do) take their place in the job from ``group``, the process group every rank
    passes: its rank and size, ``LOCAL_RANK`` the current CUDA device (on one node, as spawn
    starts them), and a rendezvous port rank 0 picks and broadcasts over the group (a collective:
    every rank's ``Buffer`` calls it). Under a launcher, or without a group, nothing changes."""
    if group is None or _env_int("RANK", "SLURM_PROCID") is not None:
        return
    import socket
    import torch.distributed as dist
    rank, size = group.rank(), group.size()
    port = [0]
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    dist.broadcast_object_list(port, src=dist.get_global_rank(group, 0), group=group)
    local = torch.cuda.current_device() if device != "cpu" and torch.cuda.is_available() else rank
    os.environ.update({
        "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(size),
        "IBGDA_BOOTSTRAP_PORT": str(port[0]),
    })
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")


class Buffer:
    """DeepEP V1's ``Buffer``: ``num_nvl_bytes`` sizes the high-throughput area
    (:meth:`get_ht_buffer_size_hint`), ``num_rdma_bytes`` the low-latency one
    (:meth:`get_low_latency_rdma_size_hint`). Collective: every rank creates it."""

    num_sms: int = 20

    def __init__(self, group=None, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 explicitly_destroy: bool = False, device: str = "auto", **_unused):
        if os.environ.get("IBGDA_DEVICE", "").lower() == "cpu" or (device == "auto" and not torch.cuda.is_available()):
            device = "cpu"
        if device != "cpu" and _uses_emulated_nic() and _module_loading().upper() != "EAGER":
            raise RuntimeError(
                "ibgda_ep.Buffer: IBGDA_TRANSPORT runs peers through the emulated NIC, whose GPU engine is a kernel "
                f"that runs until destroy(); with CUDA_MODULE_LOADING={_module_loading()} every first launch of a "
                "PyTorch kernel would wait for it forever. Set CUDA_MODULE_LOADING=EAGER before CUDA starts "
                "(importing ibgda_ep before any CUDA call does it)")
        if device != "cpu" and _uses_emulated_nic():
            _warm_up_cuda()
        _join_group_if_not_launched(group, device)
        self.num_sms = int(Buffer.num_sms)
        self._rt = Runtime(int(num_nvl_bytes), int(num_rdma_bytes), self.num_sms, device)
        self._sms = self.num_sms  # what the runtime's high-throughput kernels run on now
        self._in_flight = []  # (event, tensors) of async calls: kept until the event is done
        self._zero_copy = None
        self.rank, self.group_size = self._rt.rank, self._rt.world
        if group is not None and (group.rank() != self.rank or group.size() != self.group_size):
            raise ValueError(f"ibgda_ep.Buffer: the group is rank {group.rank()} of {group.size()}, but the "
                             f"launch environment says rank {self.rank} of {self.group_size}")
        self.num_nvl_bytes, self.num_rdma_bytes = int(num_nvl_bytes), int(num_rdma_bytes)
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        if self._rt.is_gpu:
            self._device_index = self._rt.gpu_ordinal
            self._ll_geometries, self._ht_geometries = {}, {}
            self.device = torch.device("cuda", self._device_index)
            self._comm = torch.cuda.ExternalStream(self._rt.stream, device=self.device)
        else:
            self.device = torch.device("cpu")
            self._device_index = -1  # no CUDA ordinal: the CPU emulation
            self._comm = None
            self._ll_geometries, self._ht_geometries = {}, {}

    # ------------------------------------------------------------------ configuration

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        """Blocks per high-throughput kernel of calls without a ``config`` from now on, and of the
        configs :meth:`get_dispatch_config` / :meth:`get_combine_config` return (DeepEP's static
        call)."""
        if not 1 <= new_num_sms <= 128:
            raise ValueError(f"set_num_sms: {new_num_sms} is not in 1..128")
        Buffer.num_sms = new_num_sms

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        """The config a dispatch uses by default on ``num_ranks`` ranks (the SMs set by
        :meth:`set_num_sms`)."""
        if num_ranks < 1:
            raise ValueError(f"get_dispatch_config: {num_ranks} ranks")
        return Config(Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        """The config a combine uses by default on ``num_ranks`` ranks."""
        if num_ranks < 1:
            raise ValueError(f"get_combine_config: {num_ranks} ranks")
        return Config(Buffer.num_sms)

    @staticmethod
    def is_sm90_compiled() -> bool:
        """Whether the kernels are built for Hopper (sm_90): they always are (FP8 paths included)."""
        return True

    @staticmethod
    def capture() -> EventOverlap:
        """An event recorded on the current stream now (``EventOverlap(None)`` on the CPU): a
        ``previous_event`` for the next call."""
        if not torch.cuda.is_available():
            return EventOverlap(None)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream())
        return EventOverlap(event)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        return Runtime.ll_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    @staticmethod
    def get_ht_buffer_size_hint(num_max_tokens_per_rank: int, hidden: int, num_ranks: int, num_topk: int = 8) -> int:
        return Runtime.ht_size_hint(num_ranks, num_max_tokens_per_rank, hidden, num_topk)

    def transports(self) -> List[str]:
        return self._rt.transports()

    def destroy(self) -> None:
        """Collective: frees the buffer's areas and leaves the job, once this rank's calls are
        done (a buffer made with ``explicitly_destroy``, as DeepEP's)."""
        if self._comm is not None:
            self._comm.synchronize()
        self._in_flight, self._zero_copy = [], None
        self._rt.destroy()

    # ------------------------------------------------------------------ helpers

    def _check(self, call: str, name: str, t, dtype, shape=None, allow_none=False):
        if t is None:
            if allow_none:
                return
            raise ValueError(f"{call} on rank {self.rank}: {name} is required")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{call} on rank {self.rank}: {name} must be a torch.Tensor, not {type(t).__name__}")
        # is_cuda / is_cpu and get_device() (the ordinal) cost a fraction of building and
        # comparing t.device.
        on_buffer = t.is_cuda and t.get_device() == self._device_index if self._device_index >= 0 else t.is_cpu
        if not on_buffer:
            raise ValueError(f"{call} on rank {self.rank}: {name} is on {t.device}, the buffer on {self.device}")
        if dtype is not None and t.dtype != dtype:
            raise ValueError(f"{call} on rank {self.rank}: {name} is {t.dtype}, expected {dtype}")
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ValueError(f"{call} on rank {self.rank}: {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{call} on rank {self.rank}: {name} must be contiguous")

    def _own(self, call: str, handle) -> None:
        if getattr(handle, "owner", None) is not self:
            raise ValueError(f"{call} on rank {self.rank}: the handle belongs to another Buffer")

    def _check_config(self, call: str, config) -> None:
        """Applies a high-throughput call's ``config`` (a :class:`Config`; DeepEP's default when
        ``None``: ``Config(Buffer.num_sms)``, the SMs :meth:`set_num_sms` last set): its kernels
        run on ``config.num_sms`` blocks. A dispatch's notify and data kernels run in one call, so
        they always agree; a combine may use another count."""
        if config is None:
            sms = Buffer.num_sms
        elif not isinstance(config, Config):
            raise ValueError(f"{call} on rank {self.rank}: config must be an ibgda_ep.Config, not {type(config).__name__}")
        else:
            sms = config.num_sms
        if sms != self._sms:
            self._rt.set_num_sms(sms)
            self._sms = sms

    def _current_raw_stream(self) -> int:
        # The caller's current stream as a raw handle, without building a torch Stream object
        # (PyTorch's private accessor when it has one, which costs a fraction of current_stream()).
        if _raw_current_stream is not None:
            return _raw_current_stream(self._device_index)
        return torch.cuda.current_stream(self._device_index).cuda_stream

    def _enter(self, previous_event: Optional[EventOverlap]):
        if self._comm is None:
            return
        if previous_event is not None and previous_event.event is not None:
            self._comm.wait_event(previous_event.event)
        else:
            # The communication stream waits for the caller's: one event, recorded and waited
            # for in the native module (a Python-level wait_stream cost several microseconds).
            self._rt.wait_for_stream(self._current_raw_stream())

    def _leave(self, async_finish: bool, tensors=()) -> EventOverlap:
        if self._comm is None:
            return EventOverlap()
        if not async_finish:
            # The caller's stream waits for the call; like DeepEP, no event is returned.
            self._rt.release_to_stream(self._current_raw_stream())
            return EventOverlap()
        event = torch.cuda.Event()
        event.record(self._comm)
        # The tensors stay referenced until the communication stream is past them (what
        # record_stream would do; but that stream is the runtime's and ends with destroy(),
        # after which the allocator could not record on it when such a tensor is freed).
        self._in_flight = [(e, ts) for e, ts in self._in_flight if not e.query()]
        self._in_flight.append((event, tuple(t for t in tensors if isinstance(t, torch.Tensor))))
        return EventOverlap(event)

    # The sizes as separate ints: PyTorch parses them faster than one tuple (2.8 -> 1.9 us a
    # torch.empty on an H200 host), and each low-latency dispatch makes three before its launch.
    def _zeros(self, shape, dtype):
        return torch.zeros(*shape, dtype=dtype, device=self.device)

    def _empty(self, shape, dtype):
        return torch.empty(*shape, dtype=dtype, device=self.device)

    # ------------------------------------------------------------------ high-throughput

    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int, previous_event=None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """Returns ``(num_tokens_per_rank, None, num_tokens_per_expert, is_token_in_rank, event)``.

        No host synchronisation (as DeepEP's): an entry of ``topk_idx`` outside
        ``-1..num_experts`` is counted nowhere, and the dispatch given this ``topk_idx`` raises on
        every rank, naming the rank and the token."""
        call = "get_dispatch_layout"
        self._check(call, "topk_idx", topk_idx, torch.int64)
        if topk_idx.dim() != 2:
            raise ValueError(f"{call} on rank {self.rank}: topk_idx must be [num_tokens, num_topk], not {tuple(topk_idx.shape)}")
        t, k = topk_idx.shape
        # Uninitialised: the native call zeroes the counts on the runtime's stream (a memset from
        # the host costs a fraction of torch.zeros), the kernel writes every in_rank entry. No
        # bad-token word: the dispatch's notify checks the routing.
        per_rank = self._empty((self.group_size,), torch.int32)
        per_expert = self._empty((num_experts,), torch.int32)
        in_rank = self._empty((t, self.group_size), torch.bool)
        args = (topk_idx.data_ptr(), t, k, num_experts, per_rank.data_ptr(), per_expert.data_ptr(), in_rank.data_ptr(), 0)
        if previous_event is None and not async_finish and self._comm is not None:
            # After the caller's stream and it after the kernel, in the one native call.
            self._rt.layout(*args, self._current_raw_stream(), True)
            return per_rank, None, per_expert, in_rank, EventOverlap()
        self._enter(previous_event)
        self._rt.layout(*args)
        ev = self._leave(async_finish, (topk_idx, per_rank, per_expert, in_rank))
        return per_rank, None, per_expert, in_rank, ev

    def dispatch(self, x: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]], handle: Optional[DispatchHandle] = None,
                 num_tokens_per_rank=None, num_tokens_per_rdma_rank=None, is_token_in_rank=None,
                 num_tokens_per_expert=None, topk_idx=None, topk_weights=None, expert_alignment: int = 1,
                 num_worst_tokens: int = 0, config=None, previous_event=None, async_finish: bool = False,
                 allocate_on_comm_stream: bool = False):
        """Returns ``(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event)``;
        ``recv_x`` is a tuple ``(fp8, scales)`` when ``x`` is."""
        call = "dispatch"
        self._check_config(call, config)
        fp8 = isinstance(x, tuple)
        xs, scales = (x[0], x[1]) if fp8 else (x, None)
        if not isinstance(xs, torch.Tensor) or xs.dim() != 2:
            raise ValueError(f"{call} on rank {self.rank}: x must be a [num_tokens, hidden] tensor")
        t, h = xs.shape
        self._check(call, "x", xs, _FP8 if fp8 else torch.bfloat16)
        if fp8 and isinstance(scales, torch.Tensor) and not scales.is_contiguous():
            # DeepEP takes the scales column-major too; the kernels read them row-major.
            scales = scales.contiguous()
        if num_worst_tokens < 0:
            raise ValueError(f"{call} on rank {self.rank}: num_worst_tokens must be >= 0")
        if expert_alignment < 1:
            raise ValueError(f"{call} on rank {self.rank}: expert_alignment must be >= 1")
        if handle is not None:
            self._own(call, handle)
            if handle.num_tokens != t:
                raise ValueError(f"{call} on rank {self.rank}: the handle is for {handle.num_tokens} tokens, x has {t}")
            if num_worst_tokens:
                # Before anything is launched, from the matrix every rank's handle holds: every
                # rank raises alike (a non-cached dispatch's count exchange does the same check).
                most, d = handle._most_received_by()
                if most > num_worst_tokens:
                    who = "this rank receives" if d == self.rank else f"rank {d} receives"
                    raise ValueError(f"{call} on rank {self.rank}: {who} {most} rows, more than num_worst_tokens "
                                     f"({num_worst_tokens}); the call stopped on every rank")
            num_experts, k = handle.num_experts, handle.geo_topk
            in_rank, per_expert = handle.is_token_in_rank, handle.num_tokens_per_expert
        else:
            self._check(call, "is_token_in_rank", is_token_in_rank, torch.bool, (t, self.group_size))
            self._check(call, "num_tokens_per_expert", num_tokens_per_expert, torch.int32)
            num_experts = num_tokens_per_expert.shape[0]
            if topk_idx is None:
                # DeepEP's dispatch without top-k: rows go where is_token_in_rank says, carrying no
                # expert indices or weights (recv_topk_idx and recv_topk_weights are None).
                if topk_weights is not None:
                    raise ValueError(f"{call} on rank {self.rank}: topk_weights without topk_idx")
                k = 0
            else:
                self._check(call, "topk_idx", topk_idx, torch.int64)
                k = topk_idx.shape[1]
                self._check(call, "topk_idx", topk_idx, torch.int64, (t, k))
                self._check(call, "topk_weights", topk_weights, torch.float32, (t, k))
            in_rank, per_expert = is_token_in_rank, num_tokens_per_expert
        geo = self._ht_geometry(h, k, num_experts, fp8)
        if fp8:
            self._check(call, "x scales", scales, torch.float32, (t, h // 128))
        # A dispatch with nothing to wait for but the caller's stream orders its kernels in the
        # native calls: the notify (after the caller's stream) and the send kernel first (they
        # need no outputs, so the allocations below overlap them on the GPU), then the receive
        # kernel and the caller's stream after it.
        native_order = previous_event is None and self._comm is not None
        stream = self._current_raw_stream() if native_order else None
        if handle is not None and native_order:
            # A cached dispatch: the handle's counts and slots, no count exchange (a barrier).
            most, to = handle._most_sent()
            self._rt.ht_notify(geo, t, handle.info.data_ptr(), handle.send_slot.data_ptr(), in_rank.data_ptr(),
                               per_expert.data_ptr(), stream, cached=True, most_sent=most, receiver=to)
        elif not native_order:
            self._enter(previous_event)
        if handle is None:
            # Uninitialised: the notify writes every entry of its record, the send kernel every
            # send slot.
            info = self._empty((Runtime.info_len(self.group_size, num_experts),), torch.int32)
            send_slot = self._empty((t, self.group_size), torch.int32)
            # The notify also checks topk_idx against -1..num_experts on the GPU (no host
            # synchronisation of its own), and the rows each rank receives against
            # num_worst_tokens: read_info raises on every rank if a rank's is out of range or
            # receives more. Natively ordered, the caller's stream also follows the notify (the
            # outputs are allocated there next), in the same native call.
            self._rt.ht_notify(geo, t, info.data_ptr(), send_slot.data_ptr(), in_rank.data_ptr(), per_expert.data_ptr(),
                               stream, topk_idx.data_ptr() if k else 0, native_order, num_worst_tokens)
            if self._comm is not None and not native_order:
                self._rt.release_to_stream(self._current_raw_stream())
            vals = self._rt.read_info(geo, t, info.data_ptr())
            r = self.group_size
            num_recv = vals[2 * r]
            local = num_experts // r
            counts = vals[3 * r + 1: 3 * r + 1 + local]
            # Every pair's row count follows the status word: DeepEP's matrix as prefix sums over
            # the source ranks.
            sent = vals[3 * r + 2 + local: 3 * r + 2 + local + r * r]
            handle = DispatchHandle(self, geo, fp8, t, num_experts, info, send_slot, in_rank, per_expert,
                                    None, num_recv, counts, sent)
            handle.geo_topk, handle.topk_idx, handle.topk_weights = k, topk_idx, topk_weights
        else:
            if not native_order:
                most, to = handle._most_sent()
                self._rt.ht_notify(geo, t, handle.info.data_ptr(), handle.send_slot.data_ptr(),
                                   in_rank.data_ptr(), per_expert.data_ptr(), cached=True, most_sent=most,
                                   receiver=to)
            topk_idx = handle.topk_idx if topk_idx is None else topk_idx
            topk_weights = handle.topk_weights if topk_weights is None else topk_weights
        n = handle.num_recv
        # The send kernel needs none of the outputs: launched first (after the notify on the
        # runtime's stream), it sends while the host allocates them.
        ptrs = handle._ptrs()
        self._rt.ht_dispatch_send(geo, num_experts, xs.data_ptr(), scales.data_ptr() if fp8 else 0,
                                  topk_idx.data_ptr() if k else 0, topk_weights.data_ptr() if k else 0, t, ptrs)
        # With num_worst_tokens the outputs have that many rows (DeepEP's fixed shapes): the first
        # n are received, the rest have top-k index -1 and weight 0.
        rows = num_worst_tokens or n
        try:
            recv_x = self._empty((rows, h), _FP8 if fp8 else torch.bfloat16)
            recv_s = self._empty((rows, h // 128), torch.float32) if fp8 else None
            recv_idx = (torch.full((rows, k), -1, dtype=torch.int64, device=self.device) if num_worst_tokens
                        else self._empty((rows, k), torch.int64))
            recv_w = self._zeros((rows, k), torch.float32) if num_worst_tokens else self._empty((rows, k), torch.float32)
            recv_src = self._empty((n,), torch.int32)
        except BaseException:
            # The send kernel is running (it reads the inputs and writes the handle's send slots),
            # and every rank's rows for this one are on their way: the receive half runs without
            # outputs, dropping them and waiting for this rank's sends, so the next call cannot
            # overwrite staged rows still being sent. The caller's stream waits for both before
            # anything they read can be freed and reused.
            try:
                self._rt.ht_dispatch_discard(geo, ptrs)
            finally:
                if self._comm is not None:
                    self._rt.release_to_stream(self._current_raw_stream())
            raise
        recv = (recv_x.data_ptr(), recv_s.data_ptr() if fp8 else 0, recv_idx.data_ptr(), recv_w.data_ptr(),
                recv_src.data_ptr())
        if native_order:
            # After the caller's stream again (the outputs were allocated on it), and it after this.
            self._rt.ht_dispatch_recv(geo, ptrs, recv, stream, not async_finish)
        elif num_worst_tokens and self._comm is not None:
            # The fills of the rows past the received ones were queued on the caller's stream
            # after previous_event: the receive kernel follows them.
            self._rt.ht_dispatch_recv(geo, ptrs, recv, self._current_raw_stream(), False)
        else:
            self._rt.ht_dispatch_recv(geo, ptrs, recv)
        handle.recv_src_idx = recv_src
        if native_order and not async_finish:
            ev = EventOverlap()  # the native call made the caller's stream wait
        else:
            ev = self._leave(async_finish, (xs, scales, topk_idx, topk_weights, recv_x, recv_s, recv_idx, recv_w,
                                            recv_src))
        if num_worst_tokens:
            counts = []  # DeepEP returns no counts with fixed shapes (no host synchronisation)
        else:
            counts = [(c + expert_alignment - 1) // expert_alignment * expert_alignment for c in handle.expert_counts]
        if k == 0:
            recv_idx, recv_w = None, None
        return ((recv_x, recv_s) if fp8 else recv_x), recv_idx, recv_w, counts, handle, ev

    def combine(self, x: torch.Tensor, handle: DispatchHandle, topk_weights: Optional[torch.Tensor] = None,
                bias=None, config=None, previous_event=None, async_finish: bool = False,
                allocate_on_comm_stream: bool = False):
        """Sums every rank's row for each token (rows are already weighted by their rank's experts);
        returns ``(combined_x, combined_topk_weights, event)``."""
        call = "combine"
        self._check_config(call, config)
        self._own(call, handle)
        if bias is not None:
            raise ValueError(f"{call} on rank {self.rank}: bias is not supported yet; add it to x before combine")
        hidden = x.shape[-1] if isinstance(x, torch.Tensor) else 0
        n = handle.num_recv
        # Rows past the received ones (a dispatch with num_worst_tokens pads to that many) are
        # not combined.
        if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] > n:
            x = x[:n]
        if isinstance(topk_weights, torch.Tensor) and topk_weights.dim() == 2 and topk_weights.shape[0] > n:
            topk_weights = topk_weights[:n]
        self._check(call, "x", x, torch.bfloat16, (n, hidden))
        k = handle.geo_topk
        self._check(call, "topk_weights", topk_weights, torch.float32, (n, k), allow_none=True)
        geo = self._ht_geometry(hidden, k, handle.num_experts, False)
        out = self._empty((handle.num_tokens, hidden), torch.bfloat16)
        out_w = self._empty((handle.num_tokens, k), torch.float32) if topk_weights is not None else None
        args = (geo, handle.num_tokens, handle._ptrs(), x.data_ptr(),
                topk_weights.data_ptr() if topk_weights is not None else 0, out.data_ptr(),
                out_w.data_ptr() if out_w is not None else 0)
        if previous_event is None and self._comm is not None:
            # One native call: the ordering after the caller's stream, the kernels, and (unless
            # async_finish) the caller's stream after them.
            self._rt.ht_combine(*args, self._current_raw_stream(), not async_finish)
            if not async_finish:
                return out, out_w, EventOverlap()
            return out, out_w, self._leave(True, (x, topk_weights, out, out_w))
        self._enter(previous_event)
        self._rt.ht_combine(*args)
        ev = self._leave(async_finish, (x, topk_weights, out, out_w))
        return out, out_w, ev

    def _ht_geometry(self, hidden: int, topk: int, num_experts: int, fp8: bool):
        """The packed high-throughput geometry, checked once per shape (a native call each time
        otherwise)."""
        key = (hidden, topk, num_experts, fp8)
        geo = self._ht_geometries.get(key)
        if geo is None:
            geo = self._ht_geometries[key] = self._rt.ht_geometry(hidden, topk, num_experts, fp8)
        return geo

    # ------------------------------------------------------------------ low-latency

    def low_latency_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, num_max_dispatch_tokens_per_rank: int,
                             num_experts: int, cumulative_local_expert_recv_stats=None,
                             dispatch_wait_recv_cost_stats=None, use_fp8: bool = True, round_scale: bool = False,
                             use_ue8m0: bool = False, async_finish: bool = False, return_recv_hook: bool = False):
        """Returns ``(recv_x, recv_count, handle, event, hook)``; ``recv_x`` is
        ``(fp8 [E_local, R*maxT, H], scales [E_local, R*maxT, H/128])`` with ``use_fp8``."""
        call = "low_latency_dispatch"
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError(f"{call} on rank {self.rank}: x must be a [num_tokens, hidden] bf16 tensor")
        t, h = x.shape
        if (round_scale or use_ue8m0) and not use_fp8:
            raise ValueError(f"{call} on rank {self.rank}: round_scale / use_ue8m0 need use_fp8")
        if use_ue8m0 and h % 512:
            raise ValueError(f"{call} on rank {self.rank}: use_ue8m0 packs four 128-channel scales per int32, "
                             f"so hidden must be a multiple of 512, not {h}")
        self._check(call, "x", x, torch.bfloat16)
        self._check(call, "topk_idx", topk_idx, torch.int64)
        if topk_idx.dim() != 2 or topk_idx.shape[0] != t:
            raise ValueError(f"{call} on rank {self.rank}: topk_idx has shape {tuple(topk_idx.shape)}, expected ({t}, num_topk)")
        k = topk_idx.shape[1]
        # No value check here: it would synchronise with the host (DeepEP does none either); the
        # kernels skip entries outside 0..num_experts (a high-throughput dispatch raises on them).
        maxt = num_max_dispatch_tokens_per_rank
        key = (maxt, t, h, k, num_experts, use_fp8, round_scale, use_ue8m0)
        geo = self._ll_geometries.get(key)
        if geo is None:
            geo = self._ll_geometries[key] = self._rt.ll_geometry(*key)
        self._ll_layout(call, maxt, h, num_experts)
        r = self.group_size
        local = num_experts // r
        # The received counts and the handle's words in one allocation: recv_count [local] i32,
        # then (from an even offset) seq [2] i64 (written by the send kernels before any read),
        # layout_range [local, r] i64 and src_info [local, r * maxt] i32. The kernels take
        # addresses into it; the handle's typed views are made only when asked for.
        at_seq = local + (local & 1)
        at = (at_seq, at_seq + 4, at_seq + 4 + 2 * local * r)
        words = self._empty((at[2] + local * r * maxt,), torch.int32)
        recv_x = self._empty((local, r * maxt, h), _FP8 if use_fp8 else torch.bfloat16)
        # The scales get their own allocation: sharing the handle words' would tie the handle's
        # lifetime to theirs (a framework that frees a consumed activation's storage, as some do
        # with untyped_storage().resize_(0), would free src_info before the combine reads it).
        if use_ue8m0:
            # DeepEP's UE8M0 scales: each power-of-two scale's exponent byte, four per int32.
            recv_s = self._empty((local, r * maxt, h // 512), torch.int32)
        else:
            recv_s = self._empty((local, r * maxt, h // 128), torch.float32) if use_fp8 else None
        stats = cumulative_local_expert_recv_stats
        if stats is not None:
            self._check(call, "cumulative_local_expert_recv_stats", stats, torch.int32, (local,))
        # The kernel needs addresses only: the handle object and the recv_count view (a few
        # microseconds of host time each) are made after the launch, so a call from an idle GPU
        # starts its kernel sooner. recv_count is the words' first `local` entries.
        base = words.data_ptr()
        ptrs = LowLatencyHandle.ptrs_of(base, at)
        recv = (recv_x.data_ptr(), recv_s.data_ptr() if use_fp8 else 0, base)
        released = False
        if return_recv_hook:
            # The send half now, the receive half when the hook runs (two launches of the kernel).
            self._enter(None)
            self._rt.ll_dispatch_send(geo, num_experts, x.data_ptr(), topk_idx.data_ptr(), t, ptrs)
        elif self._comm is None:
            self._rt.ll_dispatch(geo, num_experts, x.data_ptr(), topk_idx.data_ptr(), t, ptrs, recv)
        else:
            # One kernel launch for both halves, as DeepEP, ordered after the caller's stream
            # (and, when nothing else follows on the runtime's stream, the caller's stream after
            # it) in the same native call.
            released = not async_finish and stats is None
            self._rt.ll_dispatch(geo, num_experts, x.data_ptr(), topk_idx.data_ptr(), t, ptrs, recv,
                                 self._current_raw_stream(), released)
        recv_count = words[:local]
        handle = LowLatencyHandle(self, geo, t, maxt, h, num_experts, words, at, ptrs)

        def count_received():
            if stats is not None:
                # Each local expert's received tokens, added on the stream that received them.
                if self._comm is not None:
                    with torch.cuda.stream(self._comm):
                        stats.add_(recv_count)
                else:
                    stats.add_(recv_count)

        def receive():
            self._rt.ll_dispatch_recv(geo, handle._ptrs(), recv)
            count_received()

        def recv_hook():
            self._enter(None)
            receive()
            self._leave(False)

        if not return_recv_hook:
            count_received()
        if released:
            ev = EventOverlap()  # the native call made the caller's stream wait
        else:
            ev = self._leave(async_finish, (x, topk_idx, recv_x, recv_s, words))
        out = (recv_x, recv_s) if use_fp8 else recv_x
        return out, recv_count, handle, ev, (recv_hook if return_recv_hook else (lambda: None))

    def _ll_layout(self, call: str, max_tokens: int, hidden: int, num_experts: int) -> None:
        """The low-latency area's layout follows (max tokens, hidden, experts); a call of another
        shape would find stale counters and counts where it puts its own, so it must follow a
        clean_low_latency_buffer (DeepEP's rule, enforced)."""
        shape = (max_tokens, hidden, num_experts)
        last = getattr(self, "_ll_shape", None)
        if last is not None and last != shape:
            raise ValueError(f"{call} on rank {self.rank}: the low-latency layout was (num_max_dispatch_tokens_per_rank, "
                             f"hidden, num_experts) = {last} and is now {shape}; call "
                             f"clean_low_latency_buffer{shape} on every rank first")
        self._ll_shape = shape

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Collective: zeroes the low-latency area on every rank (DeepEP's), after this rank's
        work; needed before low-latency calls of another shape than the last ones (they raise
        otherwise). The next calls may use ``(num_max_dispatch_tokens_per_rank, hidden,
        num_experts)``."""
        need = Buffer.get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, self.group_size, num_experts)
        if need > self.num_rdma_bytes:
            raise ValueError(f"clean_low_latency_buffer on rank {self.rank}: {num_max_dispatch_tokens_per_rank} tokens at "
                             f"hidden {hidden} with {num_experts} experts need {need} bytes, num_rdma_bytes is {self.num_rdma_bytes}")
        self._enter(None)
        self._rt.clean_low_latency()
        self._ll_shape = None

    def _combine_input(self, handle: LowLatencyHandle, advance: bool) -> torch.Tensor:
        """The tensor the next zero-copy combine for `handle`'s shape reads (two, used in turn,
        so the next one can be filled while the previous combine may still read its own)."""
        shape = (handle.num_experts // self.group_size, self.group_size * handle.max_tokens, handle.hidden)
        bufs = getattr(self, "_zero_copy", None)
        if bufs is None or bufs[0].shape != shape:
            bufs = [self._zeros(shape, torch.bfloat16) for _ in range(2)]
            self._zero_copy, self._zero_copy_next = bufs, 0
        t = bufs[self._zero_copy_next]
        if advance:
            self._zero_copy_next ^= 1
        return t

    def get_next_low_latency_combine_buffer(self, handle: LowLatencyHandle) -> torch.Tensor:
        """DeepEP's zero-copy combine input: a ``[local experts, ranks * num_max_dispatch_tokens,
        hidden]`` bf16 tensor to write the expert outputs into; ``low_latency_combine(...,
        zero_copy=True)`` then reads them from it (its ``x`` is not read)."""
        self._own("get_next_low_latency_combine_buffer", handle)
        return self._combine_input(handle, advance=False)

    def low_latency_combine(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                            handle: LowLatencyHandle, use_logfmt: bool = False, zero_copy: bool = False,
                            async_finish: bool = False, return_recv_hook: bool = False,
                            out: Optional[torch.Tensor] = None, combine_wait_recv_cost_stats=None):
        """The ``topk_weights``-weighted sum of each token's expert outputs; returns
        ``(combined_x, event, hook)``."""
        call = "low_latency_combine"
        self._own(call, handle)
        if use_logfmt:
            raise ValueError(f"{call} on rank {self.rank}: use_logfmt is not supported yet")
        r, local = self.group_size, handle.num_experts // self.group_size
        if zero_copy:
            # The expert outputs were written into get_next_low_latency_combine_buffer's tensor:
            # the kernels read them there (x is not read).
            x = self._combine_input(handle, advance=True)
        self._check(call, "x", x, torch.bfloat16, (local, r * handle.max_tokens, handle.hidden))
        k = topk_idx.shape[1] if isinstance(topk_idx, torch.Tensor) and topk_idx.dim() == 2 else -1
        self._check(call, "topk_idx", topk_idx, torch.int64, (handle.num_tokens, k))
        self._check(call, "topk_weights", topk_weights, torch.float32, (handle.num_tokens, k))
        if out is None:
            out = self._empty((handle.num_tokens, handle.hidden), torch.bfloat16)
        else:
            self._check(call, "out", out, torch.bfloat16, (handle.num_tokens, handle.hidden))
        c = (x.data_ptr(), topk_idx.data_ptr(), topk_weights.data_ptr(), out.data_ptr())
        if return_recv_hook:
            self._enter(None)
            self._rt.ll_combine_send(handle.geo, handle._ptrs(), c)
        elif self._comm is None:
            self._rt.ll_combine(handle.geo, handle.num_tokens, handle._ptrs(), c)
        else:
            # Ordered after the caller's stream, and it after the call, in one native call.
            self._rt.ll_combine(handle.geo, handle.num_tokens, handle._ptrs(), c, self._current_raw_stream(),
                                not async_finish)

        def recv_hook():
            self._enter(None)
            self._rt.ll_combine_recv(handle.geo, handle.num_tokens, handle._ptrs(), c)
            self._leave(False)

        if return_recv_hook or async_finish:
            ev = self._leave(async_finish, (x, topk_idx, topk_weights, out))
        else:
            ev = EventOverlap()  # the native call made the caller's stream wait
        return out, ev, (recv_hook if return_recv_hook else (lambda: None))
