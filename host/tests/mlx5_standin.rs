//! The mlx5 backend's control flow and error paths at the library boundary, with no hardware: a
//! stand-in for libibverbs + libmlx5 (`tests/standin/rdma_core_standin.c`, built here as a shared
//! object against the kernel's `mlx5_ifc.h`) is loaded exactly as rdma-core is. It answers as
//! rdma-core does, including its failures, records every call, and decodes the PRM mailboxes it
//! receives with the header's own field offsets, so the test sees what firmware would read.

use ibgda::nic::mlx5::prm::{CqSpec, QpSpec};
use ibgda::nic::mlx5::{LinkLayer, Mlx5Device, Mlx5Lib};
use std::sync::Arc;

#[path = "common/mlx5_ifc.rs"]
mod mlx5_ifc;
#[path = "common/standin.rs"]
mod standin;
use standin::{standin, Knobs, SERIAL};

fn lib() -> Arc<Mlx5Lib> {
    let p = standin().to_str().unwrap();
    Arc::new(Mlx5Lib::load(p, p).unwrap())
}

fn qp_spec(uar_page: u32, cqn: u32, wq: u32, dbr: u32) -> QpSpec {
    QpSpec {
        pd: 0,
        uar_page,
        log_sq_size: 10,
        cqn_snd: cqn,
        cqn_rcv: cqn,
        wq_umem_id: wq,
        wq_umem_offset: 0,
        dbr_umem_id: dbr,
        dbr_offset: 0,
        user_index: 0,
    }
}

fn has(log: &[String], line: &str) -> bool {
    log.iter().any(|l| l == line)
}

#[test]
fn open_create_connect_and_teardown_take_nvshmems_steps_in_order() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let knobs = Knobs::open();
    let lib = lib();
    let buf = vec![0u8; 1 << 16];
    {
        let dev = Mlx5Device::open(lib.clone(), None, 1, 3).unwrap();
        assert_eq!((dev.name(), dev.pdn(), dev.eqn()), ("mlx5_0", 0x42, 9));
        let a = dev.address();
        assert_eq!(
            (a.link_layer, a.lid, a.active_mtu, a.gid[0]),
            (LinkLayer::InfiniBand, 7, 5, 0xf0)
        );
        let uar = dev.alloc_uar().unwrap();
        assert!(uar.non_cached());
        assert_eq!(uar.page_id(), 0x77);
        // SAFETY: `buf` outlives the umems (dropped first, at the end of this block).
        let (ring, dbr) = unsafe {
            (
                dev.register_umem(buf.as_ptr() as u64, 4096, Some(5)).unwrap(),
                dev.register_umem(buf.as_ptr() as u64 + 4096, 4096, Some(6)).unwrap(),
            )
        };
        assert!(ring.via_dmabuf() && dbr.via_dmabuf());
        let (cq, cqn) = dev
            .create_cq(&CqSpec {
                log_cq_size: 0,
                uar_page: uar.page_id(),
                c_eqn: dev.eqn(),
                cq_umem_id: ring.id(),
                cq_umem_offset: 0,
                dbr_umem_id: dbr.id(),
                dbr_offset: 0,
                collapsed: true,
            })
            .unwrap();
        let (qp, qpn) = dev
            .create_qp(&qp_spec(uar.page_id(), cqn, ring.id(), dbr.id()))
            .unwrap();
        dev.connect(&qp, qpn, 0x345, &a).unwrap();
        let log = knobs.log();
        // What firmware read, decoded with the kernel header's offsets.
        assert!(
            has(
                &log,
                &format!(
                    "CREATE_CQ log_cq_size=0 uar_page=0x77 c_eqn=9 cc=1 oi=1 cqe_sz=0 dbr_umem_valid=1 \
                     cq_umem_valid=1 cq_umem_id={:#x} dbr_umem_id={:#x}",
                    ring.id(),
                    dbr.id()
                )
            ),
            "{log:#?}"
        );
        assert!(
            has(
                &log,
                &format!(
                    "CREATE_QP st=0 pm_state=3 pd=0x42 uar_page=0x77 log_sq_size=10 cqn_snd={cqn:#x} rq_type=3 \
                     wq_umem_valid=1 wq_umem_id={:#x} dbr_umem_valid=1 dbr_umem_id={:#x}",
                    ring.id(),
                    dbr.id()
                )
            ),
            "{log:#?}"
        );
        assert!(
            has(&log, &format!("RST2INIT qpn={qpn:#x} rwe=1 rre=1 rae=1 port=1")),
            "{log:#?}"
        );
        assert!(
            has(
                &log,
                &format!("INIT2RTR qpn={qpn:#x} remote_qpn=0x345 mtu=5 grh=0 rlid=7 rmac=000000000000 udp_sport=0")
            ),
            "{log:#?}"
        );
        assert!(
            has(
                &log,
                &format!("RTR2RTS qpn={qpn:#x} retry=7 rnr_retry=7 ack_timeout=20")
            ),
            "{log:#?}"
        );
        drop((qp, cq, dbr, ring, uar));
    }
    // Teardown releases in reverse order of creation, the device last.
    let log = knobs.log();
    let tail: Vec<&str> = log
        .iter()
        .rev()
        .take(7)
        .rev()
        .map(|s| s.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        tail,
        [
            "mlx5dv_devx_obj_destroy",
            "mlx5dv_devx_obj_destroy",
            "mlx5dv_devx_umem_dereg",
            "mlx5dv_devx_umem_dereg",
            "mlx5dv_devx_free_uar",
            "ibv_dealloc_pd",
            "ibv_close_device"
        ],
        "{log:#?}"
    );
}

#[test]
fn no_device_and_no_mlx5_device_are_named() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let knobs = Knobs::open();
    knobs.set("devices", 0);
    let e = Mlx5Device::open(lib(), None, 1, 0).err().unwrap();
    assert_eq!(e.op, "open");
    assert!(e.to_string().contains("no RDMA device on this host"), "{e}");
    knobs.set("devices", 2);
    let e = Mlx5Device::open(lib(), None, 1, 0).err().unwrap();
    assert!(e.to_string().contains("not among the devices: rxe0 (not mlx5)"), "{e}");
    // With an mlx5 device after another provider's, that one is chosen.
    knobs.set("devices", 3);
    let dev = Mlx5Device::open(lib(), None, 1, 0).unwrap();
    assert_eq!(dev.name(), "mlx5_0");
    drop(dev);
    let e = Mlx5Device::open(lib(), Some("mlx5_9"), 1, 0).err().unwrap();
    assert!(
        e.to_string().contains("mlx5_9") && e.to_string().contains("rxe0 (not mlx5), mlx5_0"),
        "{e}"
    );
}

#[test]
fn devx_refused_is_reported_with_errno_and_leaves_nothing_open() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let knobs = Knobs::open();
    knobs.set("devx_refused", 1);
    let e = Mlx5Device::open(lib(), None, 1, 0).err().unwrap();
    assert_eq!((e.op, e.device.as_str()), ("mlx5dv_open_device(DEVX)", "mlx5_0"));
    assert!(e.what.contains("DEVX refused (errno 95"), "{e}");
    assert!(e.what.contains("verbs proxy"), "{e}");
    let log = knobs.log();
    assert!(!log.iter().any(|l| l.starts_with("ibv_alloc_pd")), "{log:#?}");
}

#[test]
fn a_port_that_is_down_is_refused_and_what_was_made_is_released() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let knobs = Knobs::open();
    knobs.set("port_down", 1);
    let e = Mlx5Device::open(lib(), None, 1, 0).err().unwrap();
    assert!(e.to_string().contains("port 1 is not active (state 1)"), "{e}");
    let log = knobs.log();
    assert_eq!(
        &log[log.len() - 2..],
        ["ibv_dealloc_pd", "ibv_close_device"],
        "{log:#?}"
    );
}

#[test]
fn dmabuf_refused_falls_back_to_peer_memory_and_both_refused_names_both() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let knobs = Knobs::open();
    knobs.set("dmabuf_refused", 1);
    let dev = Mlx5Device::open(lib(), None, 1, 0).unwrap();
    let buf = vec![0u8; 8192];
    // SAFETY: `buf` outlives the umem.
    let u = unsafe { dev.register_umem(buf.as_ptr() as u64, 8192, Some(7)) }.unwrap();
    assert!(!u.via_dmabuf());
    let log = knobs.log();
    assert!(
        has(&log, "mlx5dv_devx_umem_reg_ex fd=7 size=8192 access=1 mask=1"),
        "{log:#?}"
    );
    assert!(has(&log, "mlx5dv_devx_umem_reg size=8192 access=1"), "{log:#?}");
    drop(u);
    knobs.set("peermem_refused", 1);
    // SAFETY: as above.
    let e = unsafe { dev.register_umem(buf.as_ptr() as u64, 8192, Some(7)) }
        .err()
        .unwrap();
    assert!(
        e.what.contains("dma-buf refused (errno 95") && e.what.contains("then peer memory refused (errno 14"),
        "{e}"
    );
}

#[test]
fn a_rejected_command_reports_the_devices_status_and_syndrome() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let knobs = Knobs::open();
    knobs.set("create_qp_status", 3);
    let dev = Mlx5Device::open(lib(), None, 1, 0).unwrap();
    let e = dev.create_qp(&qp_spec(1, 1, 1, 1)).err().unwrap();
    assert_eq!(e.op, "CREATE_QP");
    assert!(e.what.contains("status 0x3, syndrome 0x5a5a"), "{e}");
    // A parameter that cannot be encoded never reaches the device.
    knobs.set("create_qp_status", 0);
    let before = knobs.log().len();
    let e = dev
        .create_qp(&QpSpec {
            log_sq_size: 16,
            ..qp_spec(1, 1, 1, 1)
        })
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("log_sq_size") && e.to_string().contains("above 15"),
        "{e}"
    );
    assert_eq!(knobs.log().len(), before, "nothing was sent");
}

#[test]
fn an_nc_uar_refused_falls_back_to_blueflame_and_roce_connects_by_gid() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let knobs = Knobs::open();
    knobs.set("nc_uar_refused", 1).set("ethernet", 1);
    let dev = Mlx5Device::open(lib(), None, 1, 3).unwrap();
    let uar = dev.alloc_uar().unwrap();
    assert!(!uar.non_cached());
    let a = dev.address();
    assert_eq!(a.link_layer, LinkLayer::Ethernet);
    let (qp, qpn) = dev.create_qp(&qp_spec(uar.page_id(), 1, 1, 1)).unwrap();
    dev.connect(&qp, qpn, 0x99, &a).unwrap();
    let log = knobs.log();
    assert!(
        has(
            &log,
            &format!(
                "INIT2RTR qpn={qpn:#x} remote_qpn=0x99 mtu=5 grh=1 rlid=0 rmac=02fbfcfdfeff udp_sport={:#x}",
                0xc000 | (qpn & 0x3fff)
            )
        ),
        "{log:#?}"
    );
    // The MAC came from an address handle for the peer's GID, made and destroyed around the step
    // (DEVX does no neighbour resolution).
    assert!(
        has(&log, "ibv_create_ah dgid[15]=0xff") && has(&log, "ibv_destroy_ah"),
        "{log:#?}"
    );
    // Connecting a QP twice is the device's "bad resource state", reported as such.
    let e = dev.connect(&qp, qpn, 0x99, &a).err().unwrap();
    assert!(e.what.contains("status 0x9"), "{e}");
}

/// The capability probe's decision for each case the stand-in can present, through the same
/// libraries (no GPU is listed on CI, so this is the node's decision; per-GPU plans use the same
/// function with the GPU's nearest NIC).
#[test]
fn the_probe_says_what_each_node_would_use_and_why() {
    use ibgda::nic::{probe_with, Mode, NicChoice};
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let knobs = Knobs::open();
    let so = standin().to_str().unwrap().to_string();
    let probe = || probe_with(NicChoice::Auto, &so, &so, std::path::Path::new("/nonexistent"));

    knobs.set("devices", 0);
    let p = probe();
    assert_eq!(p.node.0, Mode::Emulated);
    assert!(p.node.1.contains("no RDMA device"), "{}", p.node.1);

    knobs.set("devices", 1);
    let p = probe();
    assert_eq!(
        p.devx.get("mlx5_0"),
        Some(&Ok("port 1 active, InfiniBand LID 7, pdn 0x42, EQ 9".to_string()))
    );
    assert!(
        p.node.1.contains("nearest NIC mlx5_0 (mlx5") && p.node.1.contains("DEVX opens"),
        "{}",
        p.node.1
    );
    assert_eq!(p.node.0, Mode::GpuDoorbell);
    assert!(p.node.1.contains("PeerMappingOverride=1"), "{}", p.node.1);
    assert!(p.to_string().contains("DEVX on mlx5_0: opens"), "{p}");

    knobs.set("devx_refused", 1);
    let p = probe();
    let why = p.devx["mlx5_0"].as_ref().unwrap_err();
    assert!(why.contains("DEVX refused (errno 95"), "{why}");
    assert_eq!(p.node.0, Mode::VerbsProxy);
    assert!(p.node.1.contains("the CPU proxy over verbs serves it"), "{}", p.node.1);

    knobs.set("devx_refused", 0).set("devices", 2);
    let p = probe();
    assert!(p.devx.is_empty(), "no mlx5 device, no DEVX check");
    assert!(
        p.node.1.contains("rxe0 (not mlx5") && p.node.1.contains("the CPU proxy over verbs serves it"),
        "{}",
        p.node.1
    );
    assert_eq!(p.node.0, Mode::VerbsProxy);

    let emu = probe_with(NicChoice::Emu, &so, &so, std::path::Path::new("/nonexistent"));
    assert_eq!(emu.node.1, "IBGDA_NIC=emu");
}

/// Two PEs' IBGDA transports over the mlx5 backend, connected through the exchange the bootstrap
/// carries: every QP is made from umems of its own buffers, paired with the peer's matching QP,
/// taken to RTS, and the descriptor table the device code posts through names the NIC's keys and
/// doorbell; teardown releases every object.
#[test]
fn the_ibgda_transport_connects_two_pes_over_the_mlx5_backend() {
    use ibgda::placement::{HostRegion, Placement};
    use ibgda::transport::ibgda::{ConnectInfo, IbgdaOptions, PeIbgda};
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let knobs = Knobs::open();
    let lib = lib();
    let heaps = [HostRegion::zeroed(1 << 16, 4096), HostRegion::zeroed(1 << 16, 4096)];
    let opts = IbgdaOptions {
        qps_per_peer: 2,
        log_depth: 6,
        ..Default::default()
    };
    let pes: Vec<PeIbgda> = (0..2u32)
        .map(|me| {
            let nic = ibgda::nic::mlx5::Mlx5Nic::open(lib.clone(), None, 1, 0, Placement::Host, me).unwrap();
            let peers = [me != 0, me != 1];
            // SAFETY: the heaps outlive the transports (dropped first, below).
            unsafe {
                PeIbgda::create(
                    Box::new(nic),
                    Placement::Host,
                    me,
                    (heaps[me as usize].addr(), 1 << 16),
                    &peers,
                    opts,
                    None,
                )
            }
            .unwrap()
        })
        .collect();
    let infos: Vec<ConnectInfo> = pes
        .iter()
        .map(|p| ConnectInfo::decode(&p.local_info().encode()).unwrap())
        .collect();
    for p in &pes {
        p.connect(&infos).unwrap();
    }
    let log = knobs.log();
    assert_eq!(pes[0].nic().name(), "mlx5_0 port 1");
    for (me, p) in pes.iter().enumerate() {
        let peer = 1 - me;
        let d = p.descriptors();
        for index in 0..2u32 {
            let qp = p.qp(peer as u32, index).unwrap();
            let q = qp.queues();
            let slot = &d[peer * 2 + index as usize];
            assert_eq!((slot.qpn, slot.sq, slot.dbr, slot.cq), (q.qpn, q.sq, q.dbr, q.cq));
            assert_eq!(slot.lkey, p.heap_key().lkey);
            assert_eq!(slot.rkey, pes[peer].heap_key().rkey);
            assert_eq!(slot.peer_heap_base, heaps[peer].addr());
            // The standin's UAR page has its doorbell register at +0x800: CPU posters ring it there.
            assert_eq!(q.doorbell & 0xfff, 0x800, "{:#x}", q.doorbell);
            let host = q.host.expect("host placement: the CPU reaches every queue");
            // SAFETY: the QP's live CQE buffer.
            assert_eq!(unsafe { host.cqe.unwrap().read() }, 0xff, "the CQE starts invalid");
            // Paired with the peer's QP of the same index, and taken all the way to RTS.
            let remote = pes[peer].qp(me as u32, index).unwrap().qpn();
            let rtr = format!(
                "INIT2RTR qpn={:#x} remote_qpn={:#x} mtu=5 grh=0 rlid=7 rmac=000000000000 udp_sport=0",
                q.qpn, remote
            );
            assert!(has(&log, &rtr), "{rtr} not in {log:#?}");
            assert!(log.iter().any(|l| l.starts_with(&format!("RTR2RTS qpn={:#x} ", q.qpn))));
        }
    }
    // Per QP: three umems (send queue, doorbell records, CQE), one CQ, one QP; per PE one UAR and
    // the heap's and landing buffers' MRs.
    let count = |prefix: &str| log.iter().filter(|l| l.starts_with(prefix)).count();
    assert_eq!(count("mlx5dv_devx_umem_reg size="), 4 * 3);
    assert_eq!(count("CREATE_CQ "), 4);
    assert_eq!(count("CREATE_QP "), 4);
    assert_eq!(count("mlx5dv_devx_alloc_uar"), 2);
    assert_eq!(
        count("ibv_reg_mr len=65536 access=0xf"),
        2,
        "the heaps, with every access right"
    );
    assert!(knobs.live() > 0);
    drop(pes);
    assert_eq!(knobs.live(), 0, "teardown released every object: {:#?}", knobs.log());
}

/// A refused registration fails the transport's creation naming the step and the device, and
/// leaves nothing behind.
#[test]
fn a_refused_heap_registration_names_the_step_and_releases_everything() {
    use ibgda::placement::{HostRegion, Placement};
    use ibgda::transport::ibgda::{IbgdaOptions, PeIbgda};
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let knobs = Knobs::open();
    knobs.set("mr_refused", 1);
    let heap = HostRegion::zeroed(1 << 16, 4096);
    let nic = ibgda::nic::mlx5::Mlx5Nic::open(lib(), None, 1, 0, Placement::Host, 0).unwrap();
    // SAFETY: the heap outlives the attempt.
    let e = unsafe {
        PeIbgda::create(
            Box::new(nic),
            Placement::Host,
            0,
            (heap.addr(), 1 << 16),
            &[false, true],
            IbgdaOptions::default(),
            None,
        )
    }
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("mlx5_0") && e.contains("ibv_reg_mr") && e.contains("errno"),
        "{e}"
    );
    assert_eq!(knobs.live(), 0, "{:#?}", knobs.log());
}

/// How a GPU PE's init picks its NIC: `auto` takes a ConnectX when one opens and otherwise the
/// emulated device; `mlx5` insists, and its error says why; `emu` never looks.
#[test]
fn init_takes_a_connectx_when_one_opens_and_the_emulated_device_otherwise() {
    use ibgda::emu::Fabric;
    use ibgda::nic::{open_for_gpu, Backend, NicChoice, NicRequest};
    use ibgda::placement::Placement;
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let knobs = Knobs::open();
    let so = standin().to_str().unwrap().to_string();
    // SAFETY: the stand-in tests are serialised by SERIAL, and nothing else in this binary reads
    // these variables.
    unsafe {
        std::env::set_var("IBGDA_LIBIBVERBS", &so);
        std::env::set_var("IBGDA_LIBMLX5", &so);
    }
    let fabric = Fabric::new();
    let open_with = |choice, proxy| {
        let req = NicRequest {
            choice,
            hca: None,
            port: 1,
            gid_index: 0,
            ..Default::default()
        };
        let mut gpu_doorbell = true;
        open_for_gpu(&req, &fabric, Placement::Host, 0, proxy, &mut gpu_doorbell).map(|n| (n.backend(), gpu_doorbell))
    };
    let open = |choice| open_with(choice, false);
    assert_eq!(open(NicChoice::Auto).unwrap(), (Backend::Mlx5, true));
    assert_eq!(open(NicChoice::Mlx5).unwrap(), (Backend::Mlx5, true));
    assert_eq!(open(NicChoice::Emu).unwrap(), (Backend::Emulated, true));
    knobs.set("devices", 0);
    assert_eq!(open(NicChoice::Auto).unwrap(), (Backend::Emulated, true));
    let e = open(NicChoice::Mlx5).err().unwrap().to_string();
    assert!(e.contains("no RDMA device"), "{e}");
    knobs.set("devices", 1).set("devx_refused", 1);
    assert_eq!(open(NicChoice::Auto).unwrap().0, Backend::Emulated);
    let e = open(NicChoice::Mlx5).err().unwrap().to_string();
    assert!(e.contains("DEVX refused"), "{e}");
    // A NIC that is not mlx5 (soft-RoCE): the proxy drives it through verbs; GPU posting cannot.
    knobs.set("devx_refused", 0).set("devices", 2);
    assert_eq!(open_with(NicChoice::Auto, true).unwrap().0, Backend::Verbs);
    assert_eq!(open_with(NicChoice::Auto, false).unwrap().0, Backend::Emulated);
    assert_eq!(open_with(NicChoice::Verbs, true).unwrap().0, Backend::Verbs);
    let e = open_with(NicChoice::Verbs, false).err().unwrap().to_string();
    assert!(e.contains("serves the CPU proxy only"), "{e}");
    assert_eq!(knobs.live(), 0, "{:#?}", knobs.log());
}

/// Memory registration: through the dma-buf first, by address when the provider refuses that,
/// and an error naming both refusals when both fail.
#[test]
fn memory_registers_by_dmabuf_then_by_address_and_names_both_refusals() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let knobs = Knobs::open();
    let dev = Mlx5Device::open(lib(), None, 1, 0).unwrap();
    let buf = vec![0u8; 8192];
    let addr = buf.as_ptr() as u64;
    // SAFETY: `buf` outlives every registration (each is dropped before it).
    let mr = unsafe { dev.register_memory(addr, 8192, 0xf, Some((7, 0))) }.unwrap();
    assert!(mr.via_dmabuf() && mr.lkey() == mr.rkey());
    let line = format!("ibv_reg_dmabuf_mr off=0 len=8192 iova={addr:#x} fd=7 access=0xf");
    assert!(has(&knobs.log(), &line), "{line} not in {:#?}", knobs.log());
    drop(mr);
    knobs.set("dmabuf_mr_refused", 1);
    // SAFETY: as above.
    let mr = unsafe { dev.register_memory(addr, 8192, 0xf, Some((7, 0))) }.unwrap();
    assert!(!mr.via_dmabuf());
    assert!(has(&knobs.log(), "ibv_reg_mr len=8192 access=0xf"));
    drop(mr);
    knobs.set("mr_refused", 1);
    // SAFETY: as above.
    let e = unsafe { dev.register_memory(addr, 8192, 0xf, Some((7, 0))) }
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("ibv_reg_mr")
            && e.contains("dma-buf refused (errno 95")
            && e.contains("by address refused (errno 14"),
        "{e}"
    );
    drop(dev);
    assert_eq!(knobs.live(), 0);
}
