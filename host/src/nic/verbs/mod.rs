//! The verbs proxy's NIC: any RDMA device through standard verbs (another vendor's NIC, EFA-like
//! RC devices, soft-RoCE, or a ConnectX without DEVX), for the CPU proxy only, as UCCL-EP and
//! pplx-garden drive theirs. QPs are ordinary RC QPs whose queues the provider owns; the proxy
//! posts with `ibv_post_send` (one call per batch, the last work request signalled) and polls
//! with `ibv_poll_cq` ([`VerbsQp::post`], [`VerbsQp::poll`]). GPU posting needs mlx5 WQEs, so a
//! verbs QP reports no queues to the device code ([`NicQp::queues`] is empty) and the transports
//! accept it for the proxy alone.

pub mod ffi;

use crate::error::{Error, Result};
use crate::nic::backend::{
    Backend, LinkLayer, MemoryKey, Nic, NicAddress, NicQp, PortAddress, QpQueues, QueueHome, RemoteQp,
};
use crate::nic::device_list::{errno_text, DeviceList};
use crate::nic::mlx5::ffi::{IbvPortAttr, IBV_LINK_LAYER_ETHERNET, IBV_PORT_ACTIVE};
use crate::nic::mlx5::NicError;
use crate::placement::Placement;
use ffi::*;
use libloading::Library;
use parking_lot::Mutex;
use std::any::Any;
use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use crate::nic::mlx5::ffi::{CloseDevice, FreeDeviceList, GetDeviceList, GetDeviceName};

/// libibverbs' standard entry points, loaded.
pub struct VerbsLib {
    _verbs: Library,
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    open_device: OpenDevice,
    query_device: QueryDevice,
    close_device: CloseDevice,
    query_port: crate::nic::mlx5::ffi::QueryPort,
    query_gid: crate::nic::mlx5::ffi::QueryGid,
    alloc_pd: crate::nic::mlx5::ffi::AllocPd,
    dealloc_pd: crate::nic::mlx5::ffi::DeallocPd,
    reg_mr: crate::nic::mlx5::ffi::RegMr,
    reg_dmabuf_mr: Option<crate::nic::mlx5::ffi::RegDmabufMr>,
    dereg_mr: crate::nic::mlx5::ffi::DeregMr,
    create_cq: CreateCq,
    destroy_cq: DestroyCq,
    create_qp: CreateQp,
    destroy_qp: DestroyQp,
    modify_qp: ModifyQp,
}

impl VerbsLib {
    /// Loads libibverbs from `verbs` (a name the loader resolves, or a path).
    pub fn load(verbs: &str) -> std::result::Result<VerbsLib, NicError> {
        let err = |what: String| NicError {
            op: "load libibverbs",
            device: verbs.to_string(),
            what,
        };
        // SAFETY: loading rdma-core runs its constructors, which only register providers.
        let v = unsafe { Library::new(verbs) }.map_err(|e| err(format!("not loadable ({e})")))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol has the type declared here (checked against verbs.h by
                // host/tests/rdma_core_ffi.rs); the library stays loaded while `VerbsLib` lives.
                *unsafe { v.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| err(format!("symbol {} missing ({e})", $name)))?
            };
        }
        Ok(VerbsLib {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            open_device: sym!("ibv_open_device"),
            query_device: sym!("ibv_query_device"),
            close_device: sym!("ibv_close_device"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            // SAFETY: as in `sym!`; absent before rdma-core v34.
            reg_dmabuf_mr: unsafe { v.get(b"ibv_reg_dmabuf_mr\0") }.ok().map(|s| *s),
            dereg_mr: sym!("ibv_dereg_mr"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            create_qp: sym!("ibv_create_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            _verbs: v,
        })
    }
}

/// An RDMA device opened with standard verbs, with one protection domain.
pub struct VerbsDevice {
    lib: Arc<VerbsLib>,
    name: String,
    ctx: *mut IbvContext,
    pd: *mut IbvPd,
    port: u8,
    address: PortAddress,
    /// What `ibv_query_device` said: the limits QPs are made within.
    attr: IbvDeviceAttr,
}

// SAFETY: verbs objects may be used from any thread; they are released once, in `Drop`.
unsafe impl Send for VerbsDevice {}
// SAFETY: as for `Send`; every method takes `&self` and calls thread-safe verbs.
unsafe impl Sync for VerbsDevice {}

impl VerbsDevice {
    /// Opens `name` (or the first device) on `port`, using GID index `gid_index` on RoCE.
    pub fn open(
        lib: Arc<VerbsLib>,
        name: Option<&str>,
        port: u8,
        gid_index: u8,
    ) -> std::result::Result<Arc<VerbsDevice>, NicError> {
        let wanted = name.unwrap_or("the first RDMA device").to_string();
        let fail = |op, device: &str, what: String| NicError {
            op,
            device: device.to_string(),
            what,
        };
        // SAFETY: rdma-core's list functions, loaded with `lib`, which outlives the list.
        let list = unsafe { DeviceList::get(lib.get_device_list, lib.free_device_list) }
            .map_err(|e| fail("ibv_get_device_list", &wanted, e))?;
        let (dev, dev_name) = list
            .choose(lib.get_device_name, name, |_| Ok(()))
            .map_err(|what| fail("open", &wanted, what))?;
        // SAFETY: a listed device, the list still alive.
        let ctx = unsafe { (lib.open_device)(dev) };
        let open_errno = errno_text();
        // The context does not depend on the list.
        drop(list);
        if ctx.is_null() {
            return Err(fail("ibv_open_device", &dev_name, open_errno));
        }
        let mut d = VerbsDevice {
            lib,
            name: dev_name.clone(),
            ctx,
            pd: std::ptr::null_mut(),
            port,
            address: PortAddress {
                link_layer: LinkLayer::InfiniBand,
                lid: 0,
                gid: [0; 16],
                gid_index,
                active_mtu: 0,
            },
            attr: IbvDeviceAttr::default(),
        };
        // From here `d`'s Drop releases what was made.
        // SAFETY: an open context and a zeroed output of the header's size.
        let rc = unsafe { (d.lib.query_device)(d.ctx, &mut d.attr) };
        if rc != 0 {
            return Err(fail(
                "ibv_query_device",
                &dev_name,
                format!("returned {rc} ({})", errno_text()),
            ));
        }
        // SAFETY: an open context.
        d.pd = unsafe { (d.lib.alloc_pd)(d.ctx) };
        if d.pd.is_null() {
            return Err(fail("ibv_alloc_pd", &dev_name, errno_text()));
        }
        let mut pa = IbvPortAttr::default();
        // SAFETY: an open context and a zeroed attribute struct at least as large as the exported
        // symbol fills.
        let rc = unsafe { (d.lib.query_port)(d.ctx, port, &mut pa) };
        if rc != 0 {
            return Err(fail(
                "ibv_query_port",
                &dev_name,
                format!("port {port}: returned {rc} ({})", errno_text()),
            ));
        }
        if pa.state != IBV_PORT_ACTIVE {
            return Err(fail(
                "ibv_query_port",
                &dev_name,
                format!("port {port} is not active (state {})", pa.state),
            ));
        }
        d.address.lid = pa.lid;
        d.address.active_mtu = pa.active_mtu as u8;
        if pa.link_layer == IBV_LINK_LAYER_ETHERNET {
            d.address.link_layer = LinkLayer::Ethernet;
        }
        // SAFETY: an open context and a 16-byte output.
        let rc = unsafe { (d.lib.query_gid)(d.ctx, port, gid_index as c_int, &mut d.address.gid) };
        if rc != 0 {
            return Err(fail(
                "ibv_query_gid",
                &dev_name,
                format!("port {port} index {gid_index}: returned {rc} ({})", errno_text()),
            ));
        }
        Ok(Arc::new(d))
    }

    fn error(&self, op: &'static str, what: String) -> Error {
        NicError {
            op,
            device: self.name.clone(),
            what,
        }
        .into()
    }
}

impl Drop for VerbsDevice {
    fn drop(&mut self) {
        // SAFETY: our PD and context, released once, after every object of this device (each
        // holds the device).
        unsafe {
            if !self.pd.is_null() {
                (self.lib.dealloc_pd)(self.pd);
            }
            (self.lib.close_device)(self.ctx);
        }
    }
}

struct VerbsMr {
    dev: Arc<VerbsDevice>,
    mr: *mut IbvMr,
}

// SAFETY: an MR may be released from any thread; only read after creation.
unsafe impl Send for VerbsMr {}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        // SAFETY: ours, deregistered once.
        unsafe { (self.dev.lib.dereg_mr)(self.mr) };
    }
}

/// A verbs device behind the [`Nic`] boundary, for the proxy.
pub struct VerbsNic {
    regions: Mutex<Vec<VerbsMr>>,
    dev: Arc<VerbsDevice>,
    placement: Placement,
    pe: u32,
}

impl VerbsNic {
    /// Opens `name` (or the first RDMA device) on `port` for PE `pe`; `placement` says where the
    /// PE's buffers live (GPU memory is registered through dma-buf when the driver gives one).
    pub fn open(
        lib: Arc<VerbsLib>,
        name: Option<&str>,
        port: u8,
        gid_index: u8,
        placement: Placement,
        pe: u32,
    ) -> Result<VerbsNic> {
        Ok(VerbsNic {
            regions: Mutex::new(Vec::new()),
            dev: VerbsDevice::open(lib, name, port, gid_index)?,
            placement,
            pe,
        })
    }
}

impl Nic for VerbsNic {
    fn backend(&self) -> Backend {
        Backend::Verbs
    }

    fn name(&self) -> String {
        format!("{} port {} (verbs)", self.dev.name, self.dev.port)
    }

    fn address(&self) -> NicAddress {
        NicAddress::Port(self.dev.address)
    }

    unsafe fn register(&self, addr: u64, len: u64, access: u32) -> Result<MemoryKey> {
        let cuda = match &self.placement {
            Placement::Gpu(a) => Some(a.context()),
            _ => None,
        };
        let dmabuf = crate::nic::dmabuf_for(cuda, self.pe, addr, len);
        let lib = &self.dev.lib;
        let mut refused = dmabuf.as_ref().err().map(|why| format!("no dma-buf: {why}"));
        let mut mr = std::ptr::null_mut();
        if let (Ok((fd, offset)), Some(reg)) = (&dmabuf, lib.reg_dmabuf_mr) {
            // SAFETY: our PD and a dma-buf covering the caller's range from byte `offset`.
            mr = unsafe {
                reg(
                    self.dev.pd,
                    *offset,
                    len as usize,
                    addr,
                    fd.as_raw_fd(),
                    access as c_int,
                )
            };
            if mr.is_null() {
                refused = Some(format!("dma-buf refused ({})", errno_text()));
            }
        }
        if mr.is_null() {
            // SAFETY: our PD and the caller's range (this function's contract).
            mr = unsafe { (lib.reg_mr)(self.dev.pd, addr as *mut c_void, len as usize, access as c_int) };
        }
        if mr.is_null() {
            let why = match refused {
                Some(d) => format!("{d}, then by address refused ({})", errno_text()),
                None => format!("refused ({})", errno_text()),
            };
            return Err(self.dev.error("ibv_reg_mr", format!("{len} bytes at {addr:#x}: {why}")));
        }
        // SAFETY: a live MR.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        self.regions.lock().push(VerbsMr {
            dev: self.dev.clone(),
            mr,
        });
        Ok(MemoryKey { lkey, rkey, addr, len })
    }

    fn create_qp(&self, log_depth: u32, _home: QueueHome<'_>) -> Result<Arc<dyn NicQp>> {
        // Within the device's limits (a NIC may hold fewer WRs than the proxy asks for).
        let max_wr = self.dev.attr.max_qp_wr.max(1) as u32;
        let depth = (1u32 << log_depth.min(15)).min(max_wr);
        let lib = &self.dev.lib;
        // SAFETY: an open context; no completion channel.
        let cq = unsafe {
            (lib.create_cq)(
                self.dev.ctx,
                depth as c_int,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(self
                .dev
                .error("ibv_create_cq", format!("{depth} entries: {}", errno_text())));
        }
        let mut init = IbvQpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: std::ptr::null_mut(),
            cap: IbvQpCap {
                max_send_wr: depth,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: INLINE_BYTES,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: our PD and a valid attribute struct.
        let qp = unsafe { (lib.create_qp)(self.dev.pd, &mut init) };
        if qp.is_null() {
            let e = self
                .dev
                .error("ibv_create_qp", format!("RC, {depth} send WRs: {}", errno_text()));
            // SAFETY: the CQ made above, destroyed once.
            unsafe { (lib.destroy_cq)(cq) };
            return Err(e);
        }
        // The provider writes back what it made; the proxy keeps within that.
        let depth = depth.min(init.cap.max_send_wr.max(1));
        Ok(Arc::new(VerbsQp {
            qp,
            cq,
            depth,
            log_depth: 31 - depth.leading_zeros(),
            dev: self.dev.clone(),
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Bytes a work request may carry inline: the proxy's `p` writes, at most 8 (more would cost the
/// provider send-queue space per request).
pub const INLINE_BYTES: u32 = 8;

/// An RC QP of a [`VerbsNic`] with its CQ.
pub struct VerbsQp {
    qp: *mut IbvQp,
    cq: *mut IbvCq,
    depth: u32,
    log_depth: u32,
    dev: Arc<VerbsDevice>,
}

// SAFETY: libibverbs objects may be used from any thread: the providers serialise posting and
// polling internally (their default, thread-safe mode); the handles are released once, in `Drop`.
unsafe impl Send for VerbsQp {}
// SAFETY: as for `Send`: concurrent `post`/`poll` calls are serialised by the provider.
unsafe impl Sync for VerbsQp {}

impl VerbsQp {
    /// Whether the device performs atomics at all (`atomic_cap` is not `IBV_ATOMIC_NONE`).
    pub fn atomics(&self) -> bool {
        self.dev.attr.atomic_cap != IBV_ATOMIC_NONE
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.dev.name
    }

    /// Send work requests the QP holds.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Posts the chain starting at `first` (`ibv_post_send`); on failure names the request the
    /// provider refused (the requests before it are posted).
    ///
    /// # Safety
    /// The chain is well formed (its `next` links end in null); every request and its scatter
    /// entries (and inline bytes) are valid for the duration of the call; the memory the scatter
    /// entries name stays registered and allocated until the requests complete.
    pub unsafe fn post(&self, first: *mut IbvSendWr) -> std::result::Result<(), String> {
        // SAFETY: a live QP whose context's operation table holds `post_send` at the offset the
        // header check confirms.
        let rc = unsafe {
            let ctx = (*self.qp).context as *const u8;
            let post: PostSend = *(ctx.add(CONTEXT_OPS_POST_SEND) as *const PostSend);
            let mut bad = std::ptr::null_mut();
            let rc = post(self.qp, first, &mut bad);
            (rc, bad)
        };
        if rc.0 != 0 {
            // SAFETY: `bad` points into the caller's chain when set.
            let which = (!rc.1.is_null()).then(|| unsafe { (*rc.1).wr_id });
            return Err(format!(
                "ibv_post_send on QP {:#x} of {} returned {} (work request {which:?}; {})",
                self.qpn(),
                self.dev.name,
                rc.0,
                errno_text()
            ));
        }
        Ok(())
    }

    /// Polls up to `wc.len()` completions (`ibv_poll_cq`); returns how many were written.
    pub fn poll(&self, wc: &mut [IbvWc]) -> std::result::Result<usize, String> {
        // SAFETY: a live CQ whose context's table holds `poll_cq` at the checked offset; `wc` has
        // room for the count passed.
        let n = unsafe {
            let ctx = (*self.cq).context as *const u8;
            let poll: PollCq = *(ctx.add(CONTEXT_OPS_POLL_CQ) as *const PollCq);
            poll(self.cq, wc.len() as c_int, wc.as_mut_ptr())
        };
        if n < 0 {
            return Err(format!(
                "ibv_poll_cq on QP {:#x} of {} returned {n}",
                self.qpn(),
                self.dev.name
            ));
        }
        Ok(n as usize)
    }

    fn modify(&self, step: &'static str, attr: &mut IbvQpAttr, mask: c_int) -> Result<()> {
        // SAFETY: a live QP and a valid attribute struct.
        let rc = unsafe { (self.dev.lib.modify_qp)(self.qp, attr, mask) };
        if rc != 0 {
            return Err(self
                .dev
                .error(step, format!("QP {:#x}: returned {rc} ({})", self.qpn(), errno_text())));
        }
        Ok(())
    }
}

impl NicQp for VerbsQp {
    fn qpn(&self) -> u32 {
        // SAFETY: a live QP.
        unsafe { (*self.qp).qp_num }
    }

    fn locator(&self) -> u64 {
        0
    }

    fn connect(&self, remote: &RemoteQp) -> Result<()> {
        let NicAddress::Port(peer) = remote.address else {
            return Err(self.dev.error(
                "ibv_modify_qp(RTR)",
                format!(
                    "QP {:#x}: the peer's QP {:#x} is on an emulated device",
                    self.qpn(),
                    remote.qpn
                ),
            ));
        };
        let me = &self.dev.address;
        let mut a = IbvQpAttr {
            qp_state: IBV_QPS_INIT,
            port_num: self.dev.port,
            qp_access_flags: crate::nic::access::ALL,
            ..Default::default()
        };
        self.modify(
            "ibv_modify_qp(INIT)",
            &mut a,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        )?;
        if peer.link_layer != me.link_layer {
            return Err(self.dev.error(
                "ibv_modify_qp(RTR)",
                format!(
                    "QP {:#x}: this port is {:?} but the peer's is {:?}",
                    self.qpn(),
                    me.link_layer,
                    peer.link_layer
                ),
            ));
        }
        let mut a = IbvQpAttr {
            qp_state: IBV_QPS_RTR,
            path_mtu: me.active_mtu.min(peer.active_mtu).clamp(1, 5) as u32,
            dest_qp_num: remote.qpn,
            max_dest_rd_atomic: self.dev.attr.max_qp_rd_atom.clamp(1, 16) as u8,
            min_rnr_timer: 12,
            ..Default::default()
        };
        a.ah_attr.port_num = self.dev.port;
        match peer.link_layer {
            LinkLayer::InfiniBand => a.ah_attr.dlid = peer.lid,
            LinkLayer::Ethernet => {
                a.ah_attr.is_global = 1;
                a.ah_attr.grh.dgid = peer.gid;
                a.ah_attr.grh.sgid_index = me.gid_index;
                // Routed RoCE v2 fabrics need room to hop (the DEVX path uses 255 too).
                a.ah_attr.grh.hop_limit = 255;
            }
        }
        self.modify(
            "ibv_modify_qp(RTR)",
            &mut a,
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER,
        )?;
        let mut a = IbvQpAttr {
            qp_state: IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: self.dev.attr.max_qp_init_rd_atom.clamp(1, 16) as u8,
            ..Default::default()
        };
        self.modify(
            "ibv_modify_qp(RTS)",
            &mut a,
            IBV_QP_STATE
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    fn queues(&self) -> QpQueues {
        // The provider owns the queues; nothing of them is the device code's.
        QpQueues {
            qpn: self.qpn(),
            log_depth: self.log_depth,
            sq: 0,
            dbr: 0,
            doorbell: 0,
            cq: 0,
            host: None,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // SAFETY: ours, destroyed once, the QP before its CQ.
        unsafe {
            (self.dev.lib.destroy_qp)(self.qp);
            (self.dev.lib.destroy_cq)(self.cq);
        }
    }
}
