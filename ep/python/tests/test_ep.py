"""pytest entry: runs ep_torch_check.py under torch.distributed.run on the CPU emulation, for 2
and 4 ranks and each transport (P2P; the emulated NIC with IBGDA; the CPU proxy)."""

import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("ranks,transport", [(2, "p2p"), (2, "ibgda"), (2, "proxy"), (4, "p2p")])
def test_dispatch_combine_on_cpu_emulation(ranks, transport):
    env = dict(os.environ, IBGDA_DEVICE="cpu", IBGDA_TRANSPORT=transport, IBGDA_TIMEOUT_MS="120000", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           "--master-port", str(free_port()), os.path.join(HERE, "ep_torch_check.py")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(ranks):
        assert f"ep_torch_check: rank {r}/{ranks} on cpu" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("transport,want", [("ibgda", "EAGER"), ("proxy", "EAGER"), ("p2p", "None")])
def test_import_picks_eager_module_loading_for_the_emulated_nic(transport, want):
    # Over the emulated NIC a GPU runs the NIC as a kernel for the buffer's lifetime; a lazily
    # loaded module would wait for it for ever, so importing ibgda_ep (before CUDA starts) must
    # choose eager loading in the C environment the CUDA libraries read, and only then.
    code = ("import ibgda_ep, ctypes; l = ctypes.CDLL(None); l.getenv.restype = ctypes.c_char_p; "
            "v = l.getenv(b'CUDA_MODULE_LOADING'); print(v.decode() if v else None); "
            "print(ibgda_ep._module_loading())")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_MODULE_LOADING"}
    env["IBGDA_TRANSPORT"] = transport
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got, seen = p.stdout.split()
    assert got == want, p.stdout
    assert seen == (want if want != "None" else "LAZY"), p.stdout


@pytest.mark.parametrize("transport", ["p2p", "ibgda"])
def test_ranks_started_by_multiprocessing_spawn_join_from_their_group(transport):
    # DeepEP's test scripts start ranks with torch.multiprocessing.spawn: no RANK or WORLD_SIZE.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(IBGDA_DEVICE="cpu", IBGDA_TRANSPORT=transport, IBGDA_TIMEOUT_MS="120000", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, os.path.join(HERE, "spawn_check.py"), "2", str(free_port())],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(2):
        assert f"spawn_check: rank {r}/2 OK on cpu" in p.stdout, p.stdout + p.stderr
