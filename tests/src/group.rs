//! Every PE of a CPU-emulated job in this process, held by one test thread: for the suites that
//! need to see all PEs at once (fault injection, heap snapshots, one PE faulting while another
//! idles). Each PE is an ordinary [`Pe`] made by [`Pe::init`] over an in-process bootstrap, so
//! these suites run exactly what a program run with `ibgda::run` runs; the group only performs
//! every PE's collective calls together and launches on every PE at once.

use ibgda::bootstrap::{Bootstrap, ThreadBootstrap};
use ibgda::transport::ibgda::IbgdaOptions;
use ibgda::transport::proxy::ProxyOptions;
use ibgda::{Config, DeviceChoice, Grid, KernelFn, Module, Pe, PeerTransport, Result, SymmetricBuffer};
use ibgda_abi::{DeviceState, ErrorRecord};
use std::sync::Arc;
use std::time::Duration;

/// How the group's PEs reach each other.
#[derive(Clone, Debug)]
pub enum Link {
    /// Loads and stores into each other's heaps.
    P2p,
    /// IBGDA on the emulated mlx5 device: device code builds WQEs, rings and polls.
    Ibgda(IbgdaOptions),
    /// The CPU proxy: device code writes descriptors that proxy threads turn into WQEs.
    Proxy(ProxyOptions),
}

/// A symmetric allocation of the group: one [`SymmetricBuffer`] per PE, at one offset.
#[derive(Clone, Debug)]
pub struct GroupBuffer<T> {
    per_pe: Vec<SymmetricBuffer<T>>,
}

impl<T> GroupBuffer<T> {
    /// PE `pe`'s handle.
    pub fn on(&self, pe: u32) -> &SymmetricBuffer<T> {
        &self.per_pe[pe as usize]
    }

    /// The offset in every heap.
    pub fn offset(&self) -> u64 {
        self.per_pe[0].offset()
    }
}

/// `n` CPU-emulated PEs of one job, all owned by the calling thread; finalized together on drop.
pub struct PeGroup {
    pes: Vec<Pe>,
}

impl PeGroup {
    /// `n_pes` CPU-emulated PEs with `heap_size`-byte heaps, connected by `link`; device waits end
    /// after `timeout`. A block runs as many CPU threads as a launch asks for (up to 1024), so
    /// warp- and block-scope code runs with whole warps.
    pub fn cpu(n_pes: u32, heap_size: u64, timeout: Duration, link: Link) -> Result<PeGroup> {
        PeGroup::new(n_pes, PeGroup::cpu_config(heap_size, timeout, link))
    }

    /// The configuration [`PeGroup::cpu`] uses, for a group that changes more of it.
    pub fn cpu_config(heap_size: u64, timeout: Duration, link: Link) -> Config {
        let mut config = Config {
            device: DeviceChoice::Cpu,
            heap_size,
            timeout,
            collective_timeout: Duration::from_secs(120),
            cpu_block_threads: 1024,
            ..Default::default()
        };
        match link {
            Link::P2p => config.transport = PeerTransport::P2p,
            Link::Ibgda(options) => {
                config.transport = PeerTransport::Ibgda;
                config.ibgda = options;
                config.qps_per_peer_auto = false;
            }
            Link::Proxy(options) => {
                config.transport = PeerTransport::Proxy;
                config.proxy = options;
            }
        }
        config
    }

    /// `n_pes` PEs made with `config`, each by [`Pe::init`] on its own thread (init is collective).
    pub fn new(n_pes: u32, config: Config) -> Result<PeGroup> {
        let boots = ThreadBootstrap::group(n_pes, config.collective_timeout);
        let made: Vec<Result<Pe>> = std::thread::scope(|s| {
            let handles: Vec<_> = boots
                .into_iter()
                .map(|b| {
                    let config = config.clone();
                    s.spawn(move || {
                        let r = Pe::init(Arc::new(b.clone()), config);
                        if r.is_err() {
                            // The others stop waiting for this PE at once.
                            b.abort();
                        }
                        r
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("PE init thread")).collect()
        });
        let mut pes = Vec::with_capacity(made.len());
        let mut first_error = None;
        for r in made {
            match r {
                Ok(pe) => pes.push(pe),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            None => Ok(PeGroup { pes }),
            Some(e) => {
                for pe in &pes {
                    pe.abort();
                }
                Err(e)
            }
        }
    }

    /// Number of PEs.
    pub fn n_pes(&self) -> u32 {
        self.pes.len() as u32
    }

    /// PE `pe`.
    pub fn pe(&self, pe: u32) -> &Pe {
        &self.pes[pe as usize]
    }

    /// `f` on every PE at once, one thread each; the results in PE order.
    pub fn each<R: Send>(&self, f: impl Fn(&Pe) -> R + Sync) -> Vec<R> {
        std::thread::scope(|s| {
            let handles: Vec<_> = self.pes.iter().map(|pe| s.spawn(|| f(pe))).collect();
            handles.into_iter().map(|h| h.join().expect("PE thread")).collect()
        })
    }

    /// `f` on every PE at once with the PE mutable (collective calls).
    pub fn each_mut<R: Send>(&mut self, f: impl Fn(&mut Pe) -> R + Sync) -> Vec<R> {
        std::thread::scope(|s| {
            let handles: Vec<_> = self.pes.iter_mut().map(|pe| s.spawn(|| f(pe))).collect();
            handles.into_iter().map(|h| h.join().expect("PE thread")).collect()
        })
    }

    /// Collective `malloc` of `len` zeroed elements on every PE.
    pub fn malloc<T: Send + Sync>(&mut self, len: usize) -> Result<GroupBuffer<T>> {
        let per_pe = self
            .each_mut(|pe| pe.malloc::<T>(len))
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        Ok(GroupBuffer { per_pe })
    }

    /// Collective `team_split_strided` on every PE: the handle (the same on every PE).
    pub fn team_split_strided(
        &mut self,
        parent: ibgda::abi::Team,
        start: u32,
        stride: u32,
        size: u32,
    ) -> Result<ibgda::abi::Team> {
        let teams = self
            .each_mut(|pe| pe.team_split_strided(parent, start, stride, size))
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        assert!(
            teams.windows(2).all(|w| w[0] == w[1]),
            "every PE gets the same handle: {teams:?}"
        );
        Ok(teams[0])
    }

    /// Collective `team_destroy` on every PE.
    pub fn team_destroy(&mut self, team: ibgda::abi::Team) -> Result<()> {
        self.each_mut(|pe| pe.team_destroy(team)).into_iter().collect()
    }

    /// Collective `free` on every PE.
    pub fn free<T: Sync>(&mut self, buf: &GroupBuffer<T>) -> Result<()> {
        self.each_mut(|pe| pe.free(*buf.on(pe.my_pe()))).into_iter().collect()
    }

    /// Collective `free_offset` on every PE.
    pub fn free_offset(&mut self, offset: u64) -> Result<()> {
        self.each_mut(|pe| pe.free_offset(offset)).into_iter().collect()
    }

    /// PE `pe`'s address of `buf` (what its kernels pass).
    pub fn ptr<T>(&self, pe: u32, buf: &GroupBuffer<T>) -> Result<u64> {
        self.pe(pe).ptr(buf.on(pe))
    }

    /// Every PE's heap size.
    pub fn heap_size(&self) -> u64 {
        self.pes[0].heap_size()
    }

    /// Copies `data` into PE `pe`'s copy of `buf` from element `start`.
    pub fn write<T: bytemuck::Pod>(&self, pe: u32, buf: &GroupBuffer<T>, start: usize, data: &[T]) -> Result<()> {
        self.pe(pe).write(buf.on(pe), start, data)
    }

    /// `len` elements of PE `pe`'s copy of `buf` from element `start`.
    pub fn read<T: bytemuck::Pod>(&self, pe: u32, buf: &GroupBuffer<T>, start: usize, len: usize) -> Result<Vec<T>> {
        self.pe(pe).read(buf.on(pe), start, len)
    }

    /// PE `pe`'s whole heap.
    pub fn heap_snapshot(&self, pe: u32) -> Result<Vec<u8>> {
        self.pe(pe).heap_snapshot()
    }

    /// The device error PE `pe` recorded, if any.
    pub fn device_error(&self, pe: u32) -> Option<ErrorRecord> {
        self.pe(pe).device_error()
    }

    /// [`launch_grid`](Self::launch_grid) with one thread per block.
    pub fn launch(&self, blocks: u32, body: impl Fn(u32, *const DeviceState) + Sync) -> Result<()> {
        self.launch_grid(blocks, 1, body)
    }

    /// Runs `body(pe, state)` as a kernel on every PE at once, through [`Pe::launch`]: a
    /// `blocks` x `threads` grid of emulated GPU threads per PE, in warps whose collectives are
    /// real. Returns the first error in PE order: a device error a kernel recorded, or a panic of
    /// an emulated thread. Bodies call device code (a bundled kernel's host function, or the
    /// device API directly) with the state they are given.
    pub fn launch_grid(&self, blocks: u32, threads: u32, body: impl Fn(u32, *const DeviceState) + Sync) -> Result<()> {
        let body: &(dyn Fn(u32, *const DeviceState) + Sync) = &body;
        let at = &body as *const &(dyn Fn(u32, *const DeviceState) + Sync) as usize;
        let results = self.each(|pe| {
            // SAFETY: `at` points at `body`, alive until every PE's launch has returned (the CPU
            // emulation's launch joins its threads); the body keeps to the device API's rules.
            unsafe {
                pe.launch(
                    &Module::Cpu,
                    HostBody,
                    Grid::new(blocks, threads),
                    (at as *const (), pe.state(), pe.my_pe()),
                )
            }
        });
        results.into_iter().collect()
    }
}

/// A host closure as a kernel of the CPU emulation: its arguments are a pointer to the closure,
/// the PE's device state and its rank.
#[derive(Clone, Copy, Debug, Default)]
struct HostBody;

impl KernelFn for HostBody {
    const NAME: &'static str = "host_body";
    type Args = (*const (), *const DeviceState, u32);

    unsafe fn run_on_host((body, state, pe): Self::Args) {
        // SAFETY: `launch_grid` passes a pointer to a live `&dyn Fn` of this type.
        let body = unsafe { &*(body as *const &(dyn Fn(u32, *const DeviceState) + Sync)) };
        body(pe, state)
    }
}

impl Drop for PeGroup {
    fn drop(&mut self) {
        // A test may end with a PE's recorded fault: clear it so that every PE finalizes (the
        // CPU emulation survives a trap), then tear down together.
        for pe in &mut self.pes {
            let _ = pe.clear_device_error();
        }
        let pes = std::mem::take(&mut self.pes);
        let ends: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = pes.into_iter().map(|pe| s.spawn(move || pe.finalize())).collect();
            handles.into_iter().map(|h| h.join()).collect()
        });
        if !std::thread::panicking() {
            for (rank, end) in ends.into_iter().enumerate() {
                match end {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => panic!("PE {rank} did not finalize: {e}"),
                    Err(_) => panic!("PE {rank} panicked in finalize"),
                }
            }
        }
    }
}
