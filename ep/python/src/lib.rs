//! `ibgda_ep._native`: the PE and the [`ibgda_ep::Buffer`] behind the Python `ibgda_ep.Buffer`.
//! Tensors arrive as device addresses (`tensor.data_ptr()`), already checked for dtype, device,
//! shape and contiguity by the Python layer; sizes and geometry are checked again here.

use ibgda::{Config, DeviceChoice, Pe};
use ibgda_ep::{
    Buffer, BufferConfig, EpError, Geometry, HtDispatch, HtHandle, HtRecv, LayoutOut, LlCombine, LlDispatch, LlHandle,
    LlRecv,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::cell::RefCell;
use std::rc::Rc;

thread_local! {
    /// This process's PE, shared by every Buffer it creates (a process is one rank).
    static PROCESS_PE: RefCell<Option<Rc<RefCell<Pe>>>> = const { RefCell::new(None) };
}

fn err(e: EpError) -> PyErr {
    match e {
        EpError::Runtime(r) => PyRuntimeError::new_err(r.to_string()),
        other => PyValueError::new_err(other.to_string()),
    }
}

fn rt(e: ibgda::Error) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// The high-throughput handle's arrays: `(info, send_slot, in_rank, tokens_per_expert)`.
fn ht_handle(h: (u64, u64, u64, u64)) -> HtHandle {
    HtHandle {
        info: h.0,
        send_slot: h.1,
        in_rank: h.2,
        tokens_per_expert: h.3,
    }
}

/// The low-latency handle's arrays: `(seq, src_info, layout_range)`.
fn ll_handle(h: (u64, u64, u64)) -> LlHandle {
    LlHandle {
        seq: h.0,
        src_info: h.1,
        layout_range: h.2,
    }
}

/// A low-latency dispatch's inputs for geometry `g`: `x`, `topk_idx`, `tokens` and the experts.
fn ll_dispatch_args(g: &Geometry, experts: u32, x: u64, topk_idx: u64, tokens: u32) -> LlDispatch {
    LlDispatch {
        x,
        topk_idx,
        tokens,
        max_tokens: g.capacity,
        hidden: g.hidden,
        topk: g.topk,
        experts,
        fp8: g.fp8,
    }
}

/// A low-latency dispatch's outputs: `(x, x_scales, count)`.
fn ll_recv(r: (u64, u64, u64)) -> LlRecv {
    LlRecv {
        x: r.0,
        x_scales: r.1,
        count: r.2,
    }
}

/// A low-latency combine's tensors: `(x, topk_idx, topk_weights, out)`.
fn ll_combine(c: (u64, u64, u64, u64)) -> LlCombine {
    LlCombine {
        x: c.0,
        topk_idx: c.1,
        topk_weights: c.2,
        out: c.3,
    }
}

/// One rank: its PE (joined from the torchrun / Slurm / `ibgda-run` environment) and buffer.
#[pyclass(unsendable)]
struct Runtime {
    pe: Rc<RefCell<Pe>>,
    buffer: Option<Buffer>,
    /// The event that orders the caller's stream and the runtime's (created on first use).
    order_event: RefCell<Option<cudarc::driver::CudaEvent>>,
}

/// A borrowed PE and buffer for one call.
struct Parts<'a>(std::cell::Ref<'a, Pe>, &'a Buffer);

impl Runtime {
    /// Makes `to` wait for the work queued on `from` so far, one of them the runtime's stream and
    /// the other `user` (nothing on the CPU emulation).
    fn order(&self, user: u64, into_runtime: bool) -> PyResult<()> {
        let parts = self.parts()?;
        let pe = &*parts.0;
        if !pe.is_gpu() {
            return Ok(());
        }
        let gpu = pe.gpu().map_err(rt)?;
        let driver = |call: &'static str| {
            move |e: cudarc::driver::DriverError| PyRuntimeError::new_err(format!("{call} on rank {}: {e}", pe.my_pe()))
        };
        let mut event = self.order_event.borrow_mut();
        if event.is_none() {
            let flags = cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
            *event = Some(gpu.context().new_event(Some(flags)).map_err(driver("cuEventCreate"))?);
        }
        let event = event.as_ref().expect("created above").cu_event();
        let mine = gpu.stream().cu_stream();
        let theirs = user as cudarc::driver::sys::CUstream;
        let (from, to) = if into_runtime { (theirs, mine) } else { (mine, theirs) };
        gpu.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: `event` is this context's live event; `mine` is the PE's live stream and
        // `theirs` the caller's live stream of the same device (`wait_for_stream`'s contract).
        unsafe { stream_order::record_then_wait(event, from, to) }.map_err(driver("cuEventRecord/cuStreamWaitEvent"))
    }

    /// Runs `launch` on the runtime's stream after what the caller's `stream` holds so far, and
    /// with `release` makes `stream` wait for it. `None`: nothing to order with (0 is a stream,
    /// CUDA's legacy default one, which PyTorch's default stream is).
    fn around(&self, stream: Option<u64>, release: bool, launch: impl FnOnce() -> PyResult<()>) -> PyResult<()> {
        if let Some(s) = stream {
            self.order(s, true)?;
        }
        launch()?;
        if let (Some(s), true) = (stream, release) {
            self.order(s, false)?;
        }
        Ok(())
    }

    fn parts(&self) -> PyResult<Parts<'_>> {
        match &self.buffer {
            Some(b) => Ok(Parts(self.pe.borrow(), b)),
            None => Err(PyRuntimeError::new_err("ibgda_ep.Buffer: used after destroy()")),
        }
    }
}

#[pymethods]
impl Runtime {
    /// Joins the job and allocates the areas (collective). `device`: "auto", "gpu" or "cpu".
    #[new]
    #[pyo3(signature = (num_nvl_bytes, num_rdma_bytes, num_sms, device, threads=1024))]
    fn new(num_nvl_bytes: u64, num_rdma_bytes: u64, num_sms: u32, device: &str, threads: u32) -> PyResult<Self> {
        let pe = match PROCESS_PE.with(|p| p.borrow().clone()) {
            Some(pe) => pe,
            None => {
                let mut config = Config::from_env().map_err(rt)?;
                config.device = match device {
                    "auto" => config.device,
                    "gpu" => DeviceChoice::Gpu,
                    "cpu" => DeviceChoice::Cpu,
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "device must be auto, gpu or cpu, not {other:?}"
                        )))
                    }
                };
                // IBGDA_SYMMETRIC_SIZE raises it.
                config.heap_size = config
                    .heap_size
                    .max(Buffer::heap_bytes_for(num_nvl_bytes, num_rdma_bytes));
                let pe = Rc::new(RefCell::new(Pe::from_env(config).map_err(rt)?));
                PROCESS_PE.with(|p| *p.borrow_mut() = Some(pe.clone()));
                pe
            }
        };
        let threads = if pe.borrow().is_gpu() { threads } else { 32 };
        let buffer = Buffer::new(
            &mut pe.borrow_mut(),
            BufferConfig {
                num_nvl_bytes,
                num_rdma_bytes,
                num_sms,
                threads,
            },
        );
        match buffer {
            Ok(b) => Ok(Runtime {
                pe,
                buffer: Some(b),
                order_event: RefCell::new(None),
            }),
            Err(e) => {
                pe.borrow().abort();
                Err(err(e))
            }
        }
    }

    /// Makes the runtime's stream wait for what is queued so far on `stream`, a raw CUDA stream
    /// of this PE's device (PyTorch's current one): one event recorded there, waited for here;
    /// what the Python layer does before each call instead of `Stream.wait_stream`, which costs
    /// a new event and several Python-level calls.
    fn wait_for_stream(&self, stream: u64) -> PyResult<()> {
        self.order(stream, true)
    }

    /// Makes `stream` wait for what is queued so far on the runtime's stream (after a call).
    fn release_to_stream(&self, stream: u64) -> PyResult<()> {
        self.order(stream, false)
    }

    #[getter]
    fn rank(&self) -> PyResult<u32> {
        Ok(self.parts()?.0.my_pe())
    }

    #[getter]
    fn world(&self) -> PyResult<u32> {
        Ok(self.parts()?.0.n_pes())
    }

    #[getter]
    fn is_gpu(&self) -> PyResult<bool> {
        Ok(self.parts()?.0.is_gpu())
    }

    /// The CUDA device ordinal of a GPU PE (-1 on the CPU emulation).
    #[getter]
    fn gpu_ordinal(&self) -> PyResult<i64> {
        let parts = self.parts()?;
        let pe = &*parts.0;
        Ok(if pe.is_gpu() {
            pe.gpu().map_err(rt)?.context().ordinal() as i64
        } else {
            -1
        })
    }

    /// The CUstream the kernels run on (0 on the CPU emulation).
    #[getter]
    fn stream(&self) -> PyResult<u64> {
        let parts = self.parts()?;
        let pe = &*parts.0;
        Ok(if pe.is_gpu() {
            pe.gpu().map_err(rt)?.stream().cu_stream() as u64
        } else {
            0
        })
    }

    /// Transport to each peer ("P2p", "Ibgda", "Proxy").
    fn transports(&self) -> PyResult<Vec<String>> {
        let parts = self.parts()?;
        let pe = &*parts.0;
        Ok((0..pe.n_pes())
            .map(|p| format!("{:?}", pe.transport_to(p).expect("in range")))
            .collect())
    }

    fn set_num_sms(&mut self, n: u32) -> PyResult<()> {
        self.buffer
            .as_mut()
            .ok_or_else(|| PyRuntimeError::new_err("used after destroy()"))?
            .set_num_sms(n)
            .map_err(err)
    }

    #[staticmethod]
    fn ht_size_hint(ranks: u32, max_tokens: u64, hidden: u32, topk: u32) -> u64 {
        Buffer::ht_size_hint(ranks, max_tokens, hidden, topk, false)
    }

    #[staticmethod]
    fn ll_size_hint(max_tokens: u32, hidden: u32, ranks: u32, experts: u32) -> u64 {
        Buffer::ll_size_hint(max_tokens, hidden, ranks, experts)
    }

    #[staticmethod]
    fn info_len(ranks: u32, experts: u32) -> usize {
        HtHandle::info_len(ranks, experts)
    }

    /// DeepEP's `get_dispatch_layout` (`bad` may be 0); with `stream`, ordered after what the
    /// caller's stream holds and, with `release`, the caller's stream after it, in this one call.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (topk_idx, tokens, topk, experts, per_rank, per_expert, in_rank, bad, stream=None, release=false))]
    fn layout(
        &self,
        topk_idx: u64,
        tokens: u32,
        topk: u32,
        experts: u32,
        per_rank: u64,
        per_expert: u64,
        in_rank: u64,
        bad: u64,
        stream: Option<u64>,
        release: bool,
    ) -> PyResult<()> {
        self.around(stream, release, || {
            let Parts(pe, b) = self.parts()?;
            let pe = &*pe;
            let out = LayoutOut {
                tokens_per_rank: per_rank,
                tokens_per_expert: per_expert,
                in_rank,
                bad,
            };
            // SAFETY: the Python layer passes live tensors of the shapes named.
            unsafe { b.layout(pe, topk_idx, tokens, topk, experts, &out) }.map_err(err)
        })
    }

    /// Checks the call's geometry; returns the packed words the other calls take.
    fn ht_geometry(&self, hidden: u32, topk: u32, experts: u32, fp8: bool) -> PyResult<(u64, u64)> {
        let Parts(_, b) = self.parts()?;
        Ok(b.ht_geometry("dispatch", hidden, topk, experts, fp8)
            .map_err(err)?
            .pack())
    }

    /// The count exchange of a dispatch; with `stream`, ordered after what the caller's stream
    /// holds so far (a cached dispatch launches it before allocating its outputs, which then
    /// overlap the kernel). With `topk_idx` (not 0) it checks every entry against `-1..experts`
    /// on the GPU; [`Runtime::read_info`] then raises on every rank if any rank's is out of range,
    /// and, with `max_recv` (DeepEP's `num_worst_tokens`, not 0), if any rank would receive more
    /// rows. With `release` (and `stream`), the caller's stream then waits for the notify. With
    /// `cached`, the notify of a cached dispatch ([`Buffer::ht_notify_cached_rows`]: the handle's
    /// record and slots, from the dispatch that made it, whose matrix's most rows one rank sends
    /// another are `most_sent`, first to `receiver`; `topk_idx` and `max_recv` unused).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (geo, tokens, info, send_slot, in_rank, per_expert, stream=None, topk_idx=0, release=false, max_recv=0, cached=false, most_sent=0, receiver=0))]
    fn ht_notify(
        &self,
        geo: (u64, u64),
        tokens: u32,
        info: u64,
        send_slot: u64,
        in_rank: u64,
        per_expert: u64,
        stream: Option<u64>,
        topk_idx: u64,
        release: bool,
        max_recv: u32,
        cached: bool,
        most_sent: u64,
        receiver: u32,
    ) -> PyResult<()> {
        self.around(stream, release, || {
            let Parts(pe, b) = self.parts()?;
            let pe = &*pe;
            let g = Geometry::unpack(geo.0, geo.1);
            let h = HtHandle {
                info,
                send_slot,
                in_rank,
                tokens_per_expert: per_expert,
            };
            // SAFETY: the Python layer passes live tensors of the shapes named (with `cached`, a
            // handle's from a dispatch that completed).
            if cached {
                unsafe { b.ht_notify_cached_rows(pe, &g, &h, most_sent, receiver) }.map_err(err)
            } else {
                unsafe { b.ht_notify(pe, &g, tokens, &h, topk_idx, max_recv) }.map_err(err)
            }
        })
    }

    /// Waits for the notify and returns its record (raises on overflow).
    fn read_info(&self, geo: (u64, u64), tokens: u32, info: u64) -> PyResult<Vec<i32>> {
        let Parts(pe, b) = self.parts()?;
        let pe = &*pe;
        let g = Geometry::unpack(geo.0, geo.1);
        let h = HtHandle {
            info,
            send_slot: 0,
            in_rank: 0,
            tokens_per_expert: 0,
        };
        // SAFETY: `info` is a live tensor of info_len int32.
        unsafe { b.read_info(pe, &g, tokens, &h) }.map_err(err)
    }

    /// The dispatch's send kernel alone, on the runtime's stream after what it holds (the notify,
    /// which ordered it after the caller's stream): it needs none of the receive outputs, so the
    /// Python layer launches it before allocating them, and the GPU sends while the host
    /// allocates. [`Runtime::ht_dispatch_recv`] must follow.
    #[allow(clippy::too_many_arguments)]
    fn ht_dispatch_send(
        &self,
        geo: (u64, u64),
        experts: u32,
        x: u64,
        x_scales: u64,
        topk_idx: u64,
        topk_weights: u64,
        tokens: u32,
        handle: (u64, u64, u64, u64),
    ) -> PyResult<()> {
        let Parts(pe, b) = self.parts()?;
        let pe = &*pe;
        let g = Geometry::unpack(geo.0, geo.1);
        let a = HtDispatch {
            x,
            x_scales,
            topk_idx,
            topk_weights,
            tokens,
            hidden: g.hidden,
            topk: g.topk,
            experts,
        };
        // SAFETY: the Python layer passes live tensors of the shapes named.
        unsafe { b.ht_dispatch_send(pe, &g, &a, &ht_handle(handle)) }.map_err(err)
    }

    /// The dispatch's receive kernel, after its [`Runtime::ht_dispatch_send`]: ordered after the
    /// caller's `stream` (the outputs were allocated on it) and, with `release`, the caller's
    /// stream after it.
    #[pyo3(signature = (geo, handle, recv, stream=None, release=false))]
    fn ht_dispatch_recv(
        &self,
        geo: (u64, u64),
        handle: (u64, u64, u64, u64),
        recv: (u64, u64, u64, u64, u64),
        stream: Option<u64>,
        release: bool,
    ) -> PyResult<()> {
        self.around(stream, release, || {
            let Parts(pe, b) = self.parts()?;
            let pe = &*pe;
            let g = Geometry::unpack(geo.0, geo.1);
            let r = HtRecv {
                x: recv.0,
                x_scales: recv.1,
                topk_idx: recv.2,
                topk_weights: recv.3,
                src: recv.4,
            };
            // SAFETY: the Python layer passes live tensors of the shapes named.
            unsafe { b.ht_dispatch_recv(pe, &g, &ht_handle(handle), &r) }.map_err(err)
        })
    }

    /// Ends a dispatch whose [`Runtime::ht_dispatch_send`] ran but whose outputs could not be
    /// allocated: its receive kernel, on the runtime's stream, with no outputs (the rows are
    /// dropped and the buffer is ready for the next call).
    fn ht_dispatch_discard(&self, geo: (u64, u64), handle: (u64, u64, u64, u64)) -> PyResult<()> {
        let Parts(pe, b) = self.parts()?;
        let pe = &*pe;
        let g = Geometry::unpack(geo.0, geo.1);
        // SAFETY: the handle's tensors are live; the kernel writes no outputs.
        unsafe { b.ht_dispatch_discard(pe, &g, &ht_handle(handle)) }.map_err(err)
    }

    /// Combine, ordered as [`Runtime::ht_dispatch_recv`].
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (geo, tokens, handle, x, weights, out, out_weights, stream=None, release=false))]
    fn ht_combine(
        &self,
        geo: (u64, u64),
        tokens: u32,
        handle: (u64, u64, u64, u64),
        x: u64,
        weights: u64,
        out: u64,
        out_weights: u64,
        stream: Option<u64>,
        release: bool,
    ) -> PyResult<()> {
        self.around(stream, release, || {
            let Parts(pe, b) = self.parts()?;
            let pe = &*pe;
            let g = Geometry::unpack(geo.0, geo.1);
            let h = ht_handle(handle);
            // SAFETY: the Python layer passes live tensors of the shapes named.
            unsafe { b.ht_combine(pe, &g, tokens, &h, x, weights, out, out_weights) }.map_err(err)
        })
    }

    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (max_tokens, tokens, hidden, topk, experts, fp8, round_scale=false, ue8m0=false))]
    #[allow(clippy::too_many_arguments)]
    fn ll_geometry(
        &self,
        max_tokens: u32,
        tokens: u32,
        hidden: u32,
        topk: u32,
        experts: u32,
        fp8: bool,
        round_scale: bool,
        ue8m0: bool,
    ) -> PyResult<(u64, u64)> {
        let Parts(_, b) = self.parts()?;
        Ok(
            b.ll_geometry("low_latency_dispatch", max_tokens, tokens, hidden, topk, experts, fp8)
                .map_err(err)?
                .with_scales(round_scale, ue8m0)
                .pack(),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn ll_dispatch_send(
        &self,
        geo: (u64, u64),
        experts: u32,
        x: u64,
        topk_idx: u64,
        tokens: u32,
        handle: (u64, u64, u64),
    ) -> PyResult<()> {
        let Parts(pe, b) = self.parts()?;
        let pe = &*pe;
        let g = Geometry::unpack(geo.0, geo.1);
        let a = ll_dispatch_args(&g, experts, x, topk_idx, tokens);
        let h = ll_handle(handle);
        // SAFETY: the Python layer passes live tensors of the shapes named.
        unsafe { b.ll_dispatch_send(pe, &g, &a, &h) }.map_err(err)
    }

    /// Both halves in one kernel launch, ordered after the caller's `stream` (a raw CUDA stream;
    /// `None`: no ordering) and, with `release`, the caller's stream after it: one call from Python where
    /// `wait_for_stream`, the launch and `release_to_stream` would be three.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (geo, experts, x, topk_idx, tokens, handle, recv, stream=None, release=false))]
    fn ll_dispatch(
        &self,
        geo: (u64, u64),
        experts: u32,
        x: u64,
        topk_idx: u64,
        tokens: u32,
        handle: (u64, u64, u64),
        recv: (u64, u64, u64),
        stream: Option<u64>,
        release: bool,
    ) -> PyResult<()> {
        self.around(stream, release, || {
            let Parts(pe, b) = self.parts()?;
            let pe = &*pe;
            let g = Geometry::unpack(geo.0, geo.1);
            let a = ll_dispatch_args(&g, experts, x, topk_idx, tokens);
            let h = ll_handle(handle);
            let r = ll_recv(recv);
            // SAFETY: the Python layer passes live tensors of the shapes named.
            unsafe { b.ll_dispatch(pe, &g, &a, &h, &r) }.map_err(err)
        })
    }

    fn ll_dispatch_recv(&self, geo: (u64, u64), handle: (u64, u64, u64), recv: (u64, u64, u64)) -> PyResult<()> {
        let Parts(pe, b) = self.parts()?;
        let pe = &*pe;
        let g = Geometry::unpack(geo.0, geo.1);
        let h = ll_handle(handle);
        let r = ll_recv(recv);
        // SAFETY: the Python layer passes live tensors of the shapes named.
        unsafe { b.ll_dispatch_recv(pe, &g, &h, &r) }.map_err(err)
    }

    /// Both halves in one kernel launch, ordered as [`Runtime::ll_dispatch`].
    #[pyo3(signature = (geo, tokens, handle, c, stream=None, release=false))]
    fn ll_combine(
        &self,
        geo: (u64, u64),
        tokens: u32,
        handle: (u64, u64, u64),
        c: (u64, u64, u64, u64),
        stream: Option<u64>,
        release: bool,
    ) -> PyResult<()> {
        self.around(stream, release, || {
            let Parts(pe, b) = self.parts()?;
            let pe = &*pe;
            let g = Geometry::unpack(geo.0, geo.1);
            let h = ll_handle(handle);
            let c = ll_combine(c);
            // SAFETY: the Python layer passes live tensors of the shapes named.
            unsafe { b.ll_combine(pe, &g, tokens, &c, &h) }.map_err(err)
        })
    }

    fn ll_combine_send(&self, geo: (u64, u64), handle: (u64, u64, u64), c: (u64, u64, u64, u64)) -> PyResult<()> {
        let Parts(pe, b) = self.parts()?;
        let pe = &*pe;
        let g = Geometry::unpack(geo.0, geo.1);
        let h = ll_handle(handle);
        let c = ll_combine(c);
        // SAFETY: the Python layer passes live tensors of the shapes named.
        unsafe { b.ll_combine_send(pe, &g, &c, &h) }.map_err(err)
    }

    fn ll_combine_recv(
        &self,
        geo: (u64, u64),
        tokens: u32,
        handle: (u64, u64, u64),
        c: (u64, u64, u64, u64),
    ) -> PyResult<()> {
        let Parts(pe, b) = self.parts()?;
        let pe = &*pe;
        let g = Geometry::unpack(geo.0, geo.1);
        let h = ll_handle(handle);
        let c = ll_combine(c);
        // SAFETY: the Python layer passes live tensors of the shapes named.
        unsafe { b.ll_combine_recv(pe, &g, tokens, &c, &h) }.map_err(err)
    }

    /// Waits for this rank's kernels; raises the device error (a timeout names the rank waited
    /// for) or a failed peer.
    fn synchronize(&self) -> PyResult<()> {
        self.parts()?.0.synchronize().map_err(rt)
    }

    /// Host barrier over every rank.
    fn barrier(&self) -> PyResult<()> {
        self.parts()?.0.barrier().map_err(rt)
    }

    /// Frees the areas (collective); the last buffer of the process also leaves the job.
    fn clean_low_latency(&self) -> PyResult<()> {
        let Parts(pe, b) = self.parts()?;
        b.clean_low_latency(&pe).map_err(err)
    }

    fn destroy(&mut self) -> PyResult<()> {
        if let Some(b) = self.buffer.take() {
            b.destroy(&mut self.pe.borrow_mut()).map_err(err)?;
            // This Runtime's and the process slot's references: nobody else uses the PE.
            if Rc::strong_count(&self.pe) == 2 {
                if let Some(pe) = PROCESS_PE.with(|p| p.borrow_mut().take()) {
                    if let Ok(pe) = Rc::try_unwrap(pe) {
                        pe.into_inner().finalize().map_err(rt)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Tells the other ranks this one failed (they raise instead of waiting out the timeout).
    fn abort(&self) -> PyResult<()> {
        self.parts()?.0.abort();
        Ok(())
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Runtime>()?;
    Ok(())
}

/// Ordering two CUDA streams through an event, with the driver's calls.
mod stream_order {
    use cudarc::driver::sys::{cuEventRecord, cuStreamWaitEvent, CUevent, CUstream};
    use cudarc::driver::DriverError;

    /// Records `event` on `from` and makes `to` wait for it.
    ///
    /// # Safety
    /// `event`, `from` and `to` are live objects of the context current on this thread.
    pub(super) unsafe fn record_then_wait(event: CUevent, from: CUstream, to: CUstream) -> Result<(), DriverError> {
        // SAFETY: this function's contract.
        unsafe {
            cuEventRecord(event, from).result()?;
            cuStreamWaitEvent(to, event, 0).result()
        }
    }
}
