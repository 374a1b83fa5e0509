//! An mlx5 device opened with DEVX: the control-plane steps NVSHMEM's IBGDA takes, in order, over
//! rdma-core loaded at run time. Open (`mlx5dv_open_device` with DEVX), protection domain and its
//! number, the port's address (LID on InfiniBand, GID on RoCE), the completion EQ, UARs for
//! doorbells, umem registration of queue memory (dma-buf first, then peer memory), and CQs and RC
//! QPs created and connected with the PRM commands of [`super::prm`].
//!
//! Every failure is a [`NicError`] naming the step, the device and rdma-core's errno. Objects are
//! owned by handles that release them in reverse order when dropped.

use super::ffi::*;
use super::prm::{self, CqSpec, Mailbox, QpSpec, RemoteAddress, RtrSpec, RtsSpec};
pub use crate::nic::backend::{LinkLayer, PortAddress};
pub(crate) use crate::nic::device_list::errno_text;
use crate::nic::device_list::DeviceList;
use libloading::Library;
use std::ffi::{c_int, c_void};
use std::fmt;
use std::sync::Arc;

/// A failed step of the mlx5 backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicError {
    /// The step (`mlx5dv_open_device`, `CREATE_QP`, ...).
    pub op: &'static str,
    /// The RDMA device (`mlx5_0`), or what was being loaded.
    pub device: String,
    /// What went wrong, with the errno rdma-core set where there is one.
    pub what: String,
}

impl fmt::Display for NicError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mlx5 backend: {} on {}: {}", self.op, self.device, self.what)
    }
}

impl std::error::Error for NicError {}

/// rdma-core's verbs and mlx5 direct-verbs entry points, loaded.
pub struct Mlx5Lib {
    _verbs: Library,
    _mlx5: Library,
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    close_device: CloseDevice,
    query_port: QueryPort,
    query_gid: QueryGid,
    alloc_pd: AllocPd,
    dealloc_pd: DeallocPd,
    is_supported: Mlx5dvIsSupported,
    open_device: Mlx5dvOpenDevice,
    init_obj: Mlx5dvInitObj,
    query_eqn: DevxQueryEqn,
    alloc_uar: DevxAllocUar,
    free_uar: DevxFreeUar,
    umem_reg: DevxUmemReg,
    umem_reg_ex: Option<DevxUmemRegEx>,
    umem_dereg: DevxUmemDereg,
    obj_create: DevxObjCreate,
    obj_modify: DevxObjModify,
    obj_destroy: DevxObjDestroy,
    reg_mr: RegMr,
    reg_dmabuf_mr: Option<RegDmabufMr>,
    dereg_mr: DeregMr,
    create_ah: CreateAh,
    destroy_ah: DestroyAh,
}

impl Mlx5Lib {
    /// Loads libibverbs from `verbs` and libmlx5 from `mlx5` (names the loader resolves, or
    /// paths). A missing library or symbol is an error naming it.
    pub fn load(verbs: &str, mlx5: &str) -> Result<Mlx5Lib, NicError> {
        let err = |what: String| NicError {
            op: "load rdma-core",
            device: format!("{verbs} + {mlx5}"),
            what,
        };
        // SAFETY: loading rdma-core runs its constructors, which only register providers.
        let v = unsafe { Library::new(verbs) }.map_err(|e| err(format!("{verbs} not loadable ({e})")))?;
        // SAFETY: as above.
        let m = unsafe { Library::new(mlx5) }.map_err(|e| err(format!("{mlx5} not loadable ({e})")))?;
        macro_rules! sym {
            ($lib:expr, $name:literal) => {
                // SAFETY: the symbol has the type declared in `ffi` (checked against the headers by
                // host/tests/rdma_core_ffi.rs); the library stays loaded while `Mlx5Lib` lives.
                *unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| err(format!("symbol {} missing ({e})", $name)))?
            };
        }
        Ok(Mlx5Lib {
            get_device_list: sym!(v, "ibv_get_device_list"),
            free_device_list: sym!(v, "ibv_free_device_list"),
            get_device_name: sym!(v, "ibv_get_device_name"),
            close_device: sym!(v, "ibv_close_device"),
            query_port: sym!(v, "ibv_query_port"),
            query_gid: sym!(v, "ibv_query_gid"),
            alloc_pd: sym!(v, "ibv_alloc_pd"),
            dealloc_pd: sym!(v, "ibv_dealloc_pd"),
            is_supported: sym!(m, "mlx5dv_is_supported"),
            open_device: sym!(m, "mlx5dv_open_device"),
            init_obj: sym!(m, "mlx5dv_init_obj"),
            query_eqn: sym!(m, "mlx5dv_devx_query_eqn"),
            alloc_uar: sym!(m, "mlx5dv_devx_alloc_uar"),
            free_uar: sym!(m, "mlx5dv_devx_free_uar"),
            umem_reg: sym!(m, "mlx5dv_devx_umem_reg"),
            // SAFETY: as in `sym!`; older rdma-core lacks it, and then dma-buf is not offered.
            umem_reg_ex: unsafe { m.get::<DevxUmemRegEx>(b"mlx5dv_devx_umem_reg_ex\0") }
                .ok()
                .map(|s| *s),
            umem_dereg: sym!(m, "mlx5dv_devx_umem_dereg"),
            obj_create: sym!(m, "mlx5dv_devx_obj_create"),
            obj_modify: sym!(m, "mlx5dv_devx_obj_modify"),
            obj_destroy: sym!(m, "mlx5dv_devx_obj_destroy"),
            reg_mr: sym!(v, "ibv_reg_mr"),
            // SAFETY: as in `sym!`; rdma-core before v34 lacks it (then only peer memory).
            reg_dmabuf_mr: unsafe { v.get::<RegDmabufMr>(b"ibv_reg_dmabuf_mr\0") }.ok().map(|s| *s),
            dereg_mr: sym!(v, "ibv_dereg_mr"),
            create_ah: sym!(v, "ibv_create_ah"),
            destroy_ah: sym!(v, "ibv_destroy_ah"),
            _verbs: v,
            _mlx5: m,
        })
    }
}

/// An mlx5 device opened with DEVX, with its protection domain.
pub struct Mlx5Device {
    lib: Arc<Mlx5Lib>,
    name: String,
    ctx: *mut IbvContext,
    pd: *mut IbvPd,
    pdn: u32,
    eqn: u32,
    port: u8,
    address: PortAddress,
}

// SAFETY: rdma-core's verbs objects may be used from any thread; the handles are only freed in
// `Drop`, with `&mut self`.
unsafe impl Send for Mlx5Device {}
// SAFETY: every method takes `&self` and calls thread-safe rdma-core entry points.
unsafe impl Sync for Mlx5Device {}

impl Mlx5Device {
    /// Opens `name` (or the first mlx5 device) with DEVX on `port`, using GID index `gid_index`
    /// on RoCE.
    pub fn open(lib: Arc<Mlx5Lib>, name: Option<&str>, port: u8, gid_index: u8) -> Result<Arc<Mlx5Device>, NicError> {
        let wanted = name.unwrap_or("the first mlx5 device").to_string();
        let fail = |op, what: String| NicError {
            op,
            device: wanted.clone(),
            what,
        };
        // SAFETY: rdma-core's list functions, loaded with `lib`, which outlives the list.
        let list = unsafe { DeviceList::get(lib.get_device_list, lib.free_device_list) }
            .map_err(|e| fail("ibv_get_device_list", format!("no device list ({e})")))?;
        let (dev, dev_name) = list
            .choose(lib.get_device_name, name, |d| {
                // SAFETY: a listed device.
                if unsafe { (lib.is_supported)(d) } {
                    Ok(())
                } else {
                    Err("not mlx5")
                }
            })
            .map_err(|what| fail("open", what))?;
        let mut attr = Mlx5dvContextAttr {
            flags: MLX5DV_CONTEXT_FLAGS_DEVX,
            comp_mask: 0,
        };
        // SAFETY: a listed device (the list is still alive) and a valid attribute struct.
        let ctx = unsafe { (lib.open_device)(dev, &mut attr) };
        let open_errno = errno_text();
        // The context does not depend on the list.
        drop(list);
        let named = dev_name.clone();
        let fail = |op, what: String| NicError {
            op,
            device: named.clone(),
            what,
        };
        if ctx.is_null() {
            return Err(fail(
                "mlx5dv_open_device(DEVX)",
                format!("DEVX refused ({open_errno}): the verbs proxy can still serve this NIC"),
            ));
        }
        let mut dev = Mlx5Device {
            lib,
            name: dev_name,
            ctx,
            pd: std::ptr::null_mut(),
            pdn: 0,
            eqn: 0,
            port,
            address: PortAddress {
                link_layer: LinkLayer::InfiniBand,
                lid: 0,
                gid: [0; 16],
                gid_index,
                active_mtu: 0,
            },
        };
        // From here `dev`'s Drop releases what was made.
        // SAFETY: an open context.
        dev.pd = unsafe { (dev.lib.alloc_pd)(dev.ctx) };
        if dev.pd.is_null() {
            return Err(fail("ibv_alloc_pd", errno_text()));
        }
        let mut dv_pd = Mlx5dvPd::default();
        let mut obj = Mlx5dvObj {
            qp: ObjPair::null(),
            cq: ObjPair::null(),
            srq: ObjPair::null(),
            rwq: ObjPair::null(),
            dm: ObjPair::null(),
            ah: ObjPair::null(),
            pd: ObjPair {
                inp: dev.pd as *mut c_void,
                out: &mut dv_pd as *mut Mlx5dvPd as *mut c_void,
            },
        };
        // SAFETY: `obj.pd` names our PD and a live output struct.
        let rc = unsafe { (dev.lib.init_obj)(&mut obj, MLX5DV_OBJ_PD) };
        if rc != 0 {
            return Err(fail("mlx5dv_init_obj(PD)", format!("returned {rc} ({})", errno_text())));
        }
        dev.pdn = dv_pd.pdn;
        let mut pa = IbvPortAttr::default();
        // SAFETY: an open context and a zeroed attribute struct at least as large as the one the
        // exported symbol fills.
        let rc = unsafe { (dev.lib.query_port)(dev.ctx, port, &mut pa) };
        if rc != 0 {
            return Err(fail(
                "ibv_query_port",
                format!("port {port}: returned {rc} ({})", errno_text()),
            ));
        }
        if pa.state != IBV_PORT_ACTIVE {
            return Err(fail(
                "ibv_query_port",
                format!("port {port} is not active (state {})", pa.state),
            ));
        }
        dev.address.lid = pa.lid;
        dev.address.active_mtu = pa.active_mtu as u8;
        dev.address.link_layer = match pa.link_layer {
            IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            _ => LinkLayer::InfiniBand,
        };
        // SAFETY: an open context and a 16-byte output.
        let rc = unsafe { (dev.lib.query_gid)(dev.ctx, port, gid_index as c_int, &mut dev.address.gid) };
        if rc != 0 {
            return Err(fail(
                "ibv_query_gid",
                format!("port {port} index {gid_index}: returned {rc} ({})", errno_text()),
            ));
        }
        // SAFETY: an open context and a valid output.
        let rc = unsafe { (dev.lib.query_eqn)(dev.ctx, 0, &mut dev.eqn) };
        if rc != 0 {
            return Err(fail(
                "mlx5dv_devx_query_eqn",
                format!("returned {rc} ({})", errno_text()),
            ));
        }
        Ok(Arc::new(dev))
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The protection domain number (`qpc.pd`).
    pub fn pdn(&self) -> u32 {
        self.pdn
    }

    /// The completion EQ for CQs.
    pub fn eqn(&self) -> u32 {
        self.eqn
    }

    /// This port's address, for the peer's INIT2RTR.
    pub fn address(&self) -> PortAddress {
        self.address
    }

    fn error(&self, op: &'static str, what: String) -> NicError {
        NicError {
            op,
            device: self.name.clone(),
            what,
        }
    }

    /// A UAR for doorbells: non-cached first (what a GPU may map), else BlueFlame.
    pub fn alloc_uar(self: &Arc<Self>) -> Result<Uar, NicError> {
        for kind in [MLX5DV_UAR_ALLOC_TYPE_NC, MLX5DV_UAR_ALLOC_TYPE_BF] {
            // SAFETY: an open context.
            let u = unsafe { (self.lib.alloc_uar)(self.ctx, kind) };
            if !u.is_null() {
                return Ok(Uar {
                    dev: self.clone(),
                    uar: u,
                    non_cached: kind == MLX5DV_UAR_ALLOC_TYPE_NC,
                });
            }
        }
        Err(self.error("mlx5dv_devx_alloc_uar", format!("neither NC nor BF ({})", errno_text())))
    }

    /// Registers `size` bytes at `addr` as a umem for queue buffers: through the dma-buf `fd` when
    /// one is given and rdma-core offers it, else (or when that is refused) as peer memory.
    ///
    /// # Safety
    /// `addr..addr+size` stays allocated until the returned handle is dropped; `fd`, if any, is a
    /// dma-buf of exactly that range.
    pub unsafe fn register_umem(
        self: &Arc<Self>,
        addr: u64,
        size: usize,
        dmabuf_fd: Option<c_int>,
    ) -> Result<Umem, NicError> {
        let mut dmabuf_refused = None;
        if let (Some(fd), Some(reg_ex)) = (dmabuf_fd, self.lib.umem_reg_ex) {
            let mut inp = Mlx5dvDevxUmemIn {
                addr: std::ptr::null_mut(),
                size,
                access: IBV_ACCESS_LOCAL_WRITE,
                pgsz_bitmap: !0xfff,
                comp_mask: MLX5DV_UMEM_MASK_DMABUF,
                dmabuf_fd: fd,
            };
            // SAFETY: an open context and a valid input naming the caller's dma-buf.
            let u = unsafe { reg_ex(self.ctx, &mut inp) };
            if !u.is_null() {
                return Ok(Umem {
                    dev: self.clone(),
                    umem: u,
                    via_dmabuf: true,
                });
            }
            dmabuf_refused = Some(errno_text());
        }
        // SAFETY: the caller's range (this function's contract).
        let u = unsafe { (self.lib.umem_reg)(self.ctx, addr as *mut c_void, size, IBV_ACCESS_LOCAL_WRITE) };
        if u.is_null() {
            let why = match dmabuf_refused {
                Some(d) => format!("dma-buf refused ({d}), then peer memory refused ({})", errno_text()),
                None => format!("peer memory refused ({})", errno_text()),
            };
            return Err(self.error("mlx5dv_devx_umem_reg", format!("{size} bytes at {addr:#x}: {why}")));
        }
        Ok(Umem {
            dev: self.clone(),
            umem: u,
            via_dmabuf: false,
        })
    }

    /// Registers `len` bytes at `addr` with `access` (`IBV_ACCESS_*`) in this device's PD:
    /// through `dmabuf` — a dma-buf `fd` whose byte `offset` is `addr` (dma-bufs cover whole
    /// pages) — when one is given and rdma-core offers it, else (or when that is refused) by
    /// address, which for GPU memory needs nvidia-peermem.
    ///
    /// # Safety
    /// The range stays allocated until the returned handle is dropped; the dma-buf, if any,
    /// covers `[addr - offset, addr + len)`.
    pub unsafe fn register_memory(
        self: &Arc<Self>,
        addr: u64,
        len: usize,
        access: u32,
        dmabuf: Option<(c_int, u64)>,
    ) -> Result<MemoryRegistration, NicError> {
        let mut dmabuf_refused = None;
        if let (Some((fd, offset)), Some(reg)) = (dmabuf, self.lib.reg_dmabuf_mr) {
            // SAFETY: our PD; the caller's dma-buf of the range (this function's contract).
            let mr = unsafe { reg(self.pd, offset, len, addr, fd, access as c_int) };
            if !mr.is_null() {
                return Ok(MemoryRegistration {
                    dev: self.clone(),
                    mr,
                    via_dmabuf: true,
                });
            }
            dmabuf_refused = Some(errno_text());
        }
        // SAFETY: our PD and the caller's range.
        let mr = unsafe { (self.lib.reg_mr)(self.pd, addr as *mut c_void, len, access as c_int) };
        if mr.is_null() {
            let why = match dmabuf_refused {
                Some(d) => format!("dma-buf refused ({d}), then by address refused ({})", errno_text()),
                None => format!("refused ({})", errno_text()),
            };
            return Err(self.error("ibv_reg_mr", format!("{len} bytes at {addr:#x}: {why}")));
        }
        Ok(MemoryRegistration {
            dev: self.clone(),
            mr,
            via_dmabuf: false,
        })
    }

    fn create(self: &Arc<Self>, cmd: Mailbox, out_bits: u32) -> Result<(DevxHandle, Mailbox), NicError> {
        let inp = cmd.bytes();
        let mut out = vec![0u8; (out_bits / 8) as usize];
        // SAFETY: an open context; input and output buffers of the stated lengths.
        let obj = unsafe {
            (self.lib.obj_create)(
                self.ctx,
                inp.as_ptr() as *const c_void,
                inp.len(),
                out.as_mut_ptr() as *mut c_void,
                out.len(),
            )
        };
        if obj.is_null() {
            let errno = errno_text();
            let what = match prm::check_output(cmd.command(), &out) {
                Err(e) => format!("{} ({errno})", e.why),
                Ok(_) => errno,
            };
            return Err(self.error(cmd.command(), what));
        }
        let out = prm::check_output(cmd.command(), &out).map_err(|e| self.error(cmd.command(), e.why))?;
        Ok((DevxHandle { dev: self.clone(), obj }, out))
    }

    /// Creates a CQ (see [`CqSpec`]); returns it with its number.
    pub fn create_cq(self: &Arc<Self>, spec: &CqSpec) -> Result<(DevxHandle, u32), NicError> {
        let cmd = prm::create_cq(spec).map_err(|e| self.error("CREATE_CQ", e.to_string()))?;
        let (h, out) = self.create(cmd, prm::create_cq_out::BITS)?;
        Ok((h, out.get(prm::create_cq_out::CQN) as u32))
    }

    /// Creates an RC QP in RESET (see [`QpSpec`]; its `pd` is this device's); returns it with its
    /// number.
    pub fn create_qp(self: &Arc<Self>, spec: &QpSpec) -> Result<(DevxHandle, u32), NicError> {
        let spec = QpSpec { pd: self.pdn, ..*spec };
        let cmd = prm::create_qp(&spec).map_err(|e| self.error("CREATE_QP", e.to_string()))?;
        let (h, out) = self.create(cmd, prm::create_qp_out::BITS)?;
        Ok((h, out.get(prm::create_qp_out::QPN) as u32))
    }

    /// The Ethernet address RoCE packets to `gid` go to (the peer's, or the next hop's on a
    /// routed fabric). DEVX bypasses the kernel's neighbour resolution, so, as NVSHMEM does, an
    /// address handle is made for the GID and the MAC read from its mlx5 address vector.
    fn resolve_mac(&self, gid: &[u8; 16]) -> Result<[u8; 6], NicError> {
        let mut attr = crate::nic::verbs::ffi::IbvAhAttr {
            is_global: 1,
            port_num: self.port,
            ..Default::default()
        };
        attr.grh.dgid = *gid;
        attr.grh.sgid_index = self.address.gid_index;
        attr.grh.hop_limit = 255;
        // SAFETY: our PD and a valid attribute struct.
        let ah = unsafe { (self.lib.create_ah)(self.pd, &mut attr) };
        if ah.is_null() {
            return Err(self.error("ibv_create_ah", format!("for GID {gid:02x?}: {}", errno_text())));
        }
        let mut dv = Mlx5dvAh {
            av: std::ptr::null_mut(),
            comp_mask: 0,
        };
        let mut obj = Mlx5dvObj {
            qp: ObjPair::null(),
            cq: ObjPair::null(),
            srq: ObjPair::null(),
            rwq: ObjPair::null(),
            dm: ObjPair::null(),
            ah: ObjPair {
                inp: ah as *mut c_void,
                out: &mut dv as *mut Mlx5dvAh as *mut c_void,
            },
            pd: ObjPair::null(),
        };
        // SAFETY: `obj.ah` names the live AH and a live output struct.
        let rc = unsafe { (self.lib.init_obj)(&mut obj, MLX5DV_OBJ_AH) };
        let mac = if rc == 0 && !dv.av.is_null() {
            let mut mac = [0u8; 6];
            // SAFETY: the AH's address vector (alive until the AH is destroyed below), which
            // holds `rmac[6]` at the offset the header check confirms.
            unsafe { std::ptr::copy_nonoverlapping(dv.av.add(MLX5_WQE_AV_RMAC), mac.as_mut_ptr(), 6) };
            Ok(mac)
        } else {
            Err(self.error("mlx5dv_init_obj(AH)", format!("returned {rc} ({})", errno_text())))
        };
        // SAFETY: the AH made above, destroyed once.
        unsafe { (self.lib.destroy_ah)(ah) };
        mac
    }

    /// Takes RC QP `qp` (number `qpn`) from RESET to RTS toward the peer's `remote_qpn` at
    /// `remote` (RST2INIT, INIT2RTR, RTR2RTS).
    pub fn connect(&self, qp: &DevxHandle, qpn: u32, remote_qpn: u32, remote: &PortAddress) -> Result<(), NicError> {
        let address = match remote.link_layer {
            LinkLayer::InfiniBand => RemoteAddress::Lid { lid: remote.lid, sl: 0 },
            LinkLayer::Ethernet => RemoteAddress::Gid {
                gid: remote.gid,
                sgid_index: self.address.gid_index,
                traffic_class: 0,
                rmac: self.resolve_mac(&remote.gid)?,
                // RoCE v2 source ports spread QPs over ECMP paths (0xc000.. is the range).
                udp_sport: 0xc000 | (qpn & 0x3fff) as u16,
            },
        };
        let mtu = self.address.active_mtu.min(remote.active_mtu).clamp(1, 5);
        let steps = [
            prm::rst2init(qpn, self.port),
            prm::init2rtr(
                qpn,
                &RtrSpec {
                    remote_qpn,
                    address,
                    mtu,
                    next_rcv_psn: 0,
                    log_rra_max: 4,
                    min_rnr_nak: 12,
                },
            ),
            prm::rtr2rts(qpn, &RtsSpec::default()),
        ];
        for step in steps {
            let cmd = step.map_err(|e| self.error(e.command, e.to_string()))?;
            let inp = cmd.bytes();
            let mut out = vec![0u8; 16];
            // SAFETY: a live QP object of this device; buffers of the stated lengths.
            let rc = unsafe {
                (self.lib.obj_modify)(
                    qp.obj,
                    inp.as_ptr() as *const c_void,
                    inp.len(),
                    out.as_mut_ptr() as *mut c_void,
                    out.len(),
                )
            };
            if rc != 0 {
                let errno = errno_text();
                let what = match prm::check_output(cmd.command(), &out) {
                    Err(e) => format!("QP {qpn:#x}: {} (returned {rc}, {errno})", e.why),
                    Ok(_) => format!("QP {qpn:#x}: returned {rc} ({errno})"),
                };
                return Err(self.error(cmd.command(), what));
            }
        }
        Ok(())
    }
}

impl ObjPair {
    fn null() -> ObjPair {
        ObjPair {
            inp: std::ptr::null_mut(),
            out: std::ptr::null_mut(),
        }
    }
}

impl Drop for Mlx5Device {
    fn drop(&mut self) {
        // SAFETY: our PD and context, released once, after every object of this device (each
        // handle holds the device, so they are gone).
        unsafe {
            if !self.pd.is_null() {
                (self.lib.dealloc_pd)(self.pd);
            }
            (self.lib.close_device)(self.ctx);
        }
    }
}

/// A UAR: its doorbell register page is what IBGDA maps into the GPU.
pub struct Uar {
    dev: Arc<Mlx5Device>,
    uar: *mut Mlx5dvDevxUar,
    non_cached: bool,
}

impl Uar {
    /// The UAR page number (`qpc.uar_page`, `cqc.uar_page`).
    pub fn page_id(&self) -> u32 {
        // SAFETY: a live UAR.
        unsafe { (*self.uar).page_id }
    }
    /// The UAR page's address in this process (what is mapped into the GPU).
    pub fn page_addr(&self) -> u64 {
        // SAFETY: a live UAR.
        unsafe { (*self.uar).base_addr as u64 }
    }
    /// The doorbell register's address in this process.
    pub fn reg_addr(&self) -> u64 {
        // SAFETY: a live UAR.
        unsafe { (*self.uar).reg_addr as u64 }
    }
    /// Whether it is a non-cached UAR (BlueFlame otherwise).
    pub fn non_cached(&self) -> bool {
        self.non_cached
    }
}

// SAFETY: rdma-core objects may be used and released from any thread; the handle is only read
// after creation and released once, in `Drop`.
unsafe impl Send for Uar {}
// SAFETY: as for `Send`.
unsafe impl Sync for Uar {}

impl Drop for Uar {
    fn drop(&mut self) {
        // SAFETY: ours, freed once.
        unsafe { (self.dev.lib.free_uar)(self.uar) }
    }
}

/// A registered umem.
pub struct Umem {
    dev: Arc<Mlx5Device>,
    umem: *mut Mlx5dvDevxUmem,
    via_dmabuf: bool,
}

impl Umem {
    /// The umem id (`*_umem_id` fields).
    pub fn id(&self) -> u32 {
        // SAFETY: a live umem.
        unsafe { (*self.umem).umem_id }
    }
    /// Whether it was registered through dma-buf (peer memory otherwise).
    pub fn via_dmabuf(&self) -> bool {
        self.via_dmabuf
    }
}

// SAFETY: rdma-core objects may be used and released from any thread; the handle is only read
// after creation and released once, in `Drop`.
unsafe impl Send for Umem {}
// SAFETY: as for `Send`.
unsafe impl Sync for Umem {}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: ours, deregistered once.
        let rc = unsafe { (self.dev.lib.umem_dereg)(self.umem) };
        if rc != 0 {
            // Firmware still uses it: the object naming it outlived it. Nothing to do but say so.
            tracing::error!(device = %self.dev.name, "mlx5dv_devx_umem_dereg failed ({rc}, {})", errno_text());
        }
    }
}

/// A registered memory region.
pub struct MemoryRegistration {
    dev: Arc<Mlx5Device>,
    mr: *mut IbvMr,
    via_dmabuf: bool,
}

// SAFETY: an rdma-core MR may be used and released from any thread.
unsafe impl Send for MemoryRegistration {}
// SAFETY: only read after creation.
unsafe impl Sync for MemoryRegistration {}

impl MemoryRegistration {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.mr).lkey }
    }
    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.mr).rkey }
    }
    /// Whether it was registered through dma-buf.
    pub fn via_dmabuf(&self) -> bool {
        self.via_dmabuf
    }
}

impl Drop for MemoryRegistration {
    fn drop(&mut self) {
        // SAFETY: ours, deregistered once.
        let rc = unsafe { (self.dev.lib.dereg_mr)(self.mr) };
        if rc != 0 {
            tracing::error!(device = %self.dev.name, "ibv_dereg_mr failed ({rc}, {})", errno_text());
        }
    }
}

/// A DEVX object (CQ, QP).
pub struct DevxHandle {
    dev: Arc<Mlx5Device>,
    obj: *mut DevxObj,
}

// SAFETY: rdma-core objects may be used and released from any thread; the handle is only read
// after creation and released once, in `Drop`.
unsafe impl Send for DevxHandle {}
// SAFETY: as for `Send`.
unsafe impl Sync for DevxHandle {}

impl Drop for DevxHandle {
    fn drop(&mut self) {
        // SAFETY: ours, destroyed once.
        let rc = unsafe { (self.dev.lib.obj_destroy)(self.obj) };
        if rc != 0 {
            tracing::error!(device = %self.dev.name, "mlx5dv_devx_obj_destroy failed ({rc}, {})", errno_text());
        }
    }
}
