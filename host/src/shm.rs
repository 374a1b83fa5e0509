//! Shared memory for CPU-emulated PEs in separate processes: each PE's heap and the tables its
//! emulated NIC exposes to peers live in a `memfd` that every process of the node maps at the
//! same virtual address (`IBGDA_SHM_VA_BASE` + rank x stride). An address then means the same
//! bytes in every process, as a symmetric address does on GPUs, so the device code, the
//! emulated NIC's engine and its tables run across processes exactly as across threads.
//!
//! A memfd has no name in the filesystem: nothing is left behind when the processes end,
//! however they end.

use crate::error::{Error, Result};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use parking_lot::Mutex;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

/// Default start of the shared windows: far above where Linux places heaps, libraries and
/// stacks on x86-64 and aarch64 (override with `IBGDA_SHM_VA_BASE`).
pub const DEFAULT_VA_BASE: u64 = 0x2000_0000_0000;
/// Windows are placed on multiples of this.
pub const WINDOW_ALIGN: u64 = 1 << 30;

/// One PE's shared window, mapped into this process at its agreed address.
#[derive(Debug)]
pub struct SharedArena {
    base: u64,
    len: usize,
    fd: OwnedFd,
    owner: u32,
    /// Bump allocator (this process's own window only).
    used: Mutex<usize>,
}

// SAFETY: the mapping is plain shared memory; every concurrent access goes through raw pointers
// with atomics or under the emulated hardware's publish protocol, never through references.
unsafe impl Send for SharedArena {}
unsafe impl Sync for SharedArena {}

fn shm_err(pe: u32, what: &str, e: impl std::fmt::Display) -> Error {
    Error::SharedMemory {
        pe,
        why: format!("{what}: {e}"),
    }
}

/// The window of PE `rank`: `(address, length)`, for windows of `len` bytes.
pub fn window(va_base: u64, rank: u32, len: usize) -> (u64, usize) {
    let stride = (len as u64).next_multiple_of(WINDOW_ALIGN);
    (va_base + rank as u64 * stride, len)
}

fn map_at(pe: u32, owner: u32, fd: BorrowedFd<'_>, at: u64, len: usize) -> Result<()> {
    let length = NonZeroUsize::new(len).ok_or_else(|| shm_err(pe, "mmap", "empty window"))?;
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping: it fails instead.
    let p = unsafe {
        mmap(
            NonZeroUsize::new(at as usize),
            length,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED | MapFlags::MAP_FIXED_NOREPLACE,
            fd,
            0,
        )
    }
    .map_err(|e| {
        shm_err(
            pe,
            &format!("mapping PE {owner}'s window at {at:#x} (+{len})"),
            format!("{e} (the range is taken in this process; set IBGDA_SHM_VA_BASE to a free range)"),
        )
    })?;
    if p.as_ptr() as u64 != at {
        // An old kernel treats MAP_FIXED_NOREPLACE as a hint.
        // SAFETY: we just mapped it.
        let _ = unsafe { munmap(p, len) };
        return Err(shm_err(
            pe,
            &format!("mapping PE {owner}'s window"),
            format!(
                "the kernel placed it at {:#x}, not {at:#x} (MAP_FIXED_NOREPLACE unsupported?)",
                p.as_ptr() as u64
            ),
        ));
    }
    Ok(())
}

impl SharedArena {
    /// PE `pe`'s own window: a zeroed memfd of `len` bytes mapped at `at`.
    pub fn create(pe: u32, at: u64, len: usize) -> Result<SharedArena> {
        let fd =
            nix::sys::memfd::memfd_create(format!("ibgda-pe{pe}").as_str(), nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                .map_err(|e| shm_err(pe, "memfd_create", e))?;
        nix::unistd::ftruncate(&fd, len as i64).map_err(|e| shm_err(pe, "ftruncate", e))?;
        map_at(pe, pe, fd.as_fd(), at, len)?;
        Ok(SharedArena {
            base: at,
            len,
            fd,
            owner: pe,
            used: Mutex::new(0),
        })
    }

    /// PE `owner`'s window, from its descriptor, mapped at the same address as in its process.
    pub fn import(pe: u32, owner: u32, fd: OwnedFd, at: u64, len: usize) -> Result<SharedArena> {
        let st = nix::sys::stat::fstat(&fd).map_err(|e| shm_err(pe, "fstat", e))?;
        if (st.st_size as u64) < len as u64 {
            return Err(shm_err(
                pe,
                &format!("importing PE {owner}'s window"),
                format!("it has {} bytes, the job's windows have {len}", st.st_size),
            ));
        }
        map_at(pe, owner, fd.as_fd(), at, len)?;
        Ok(SharedArena {
            base: at,
            len,
            fd,
            owner,
            used: Mutex::new(len),
        })
    }

    /// First byte.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The PE whose window this is.
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// The memfd (to hand to peers).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Reserves `bytes` aligned to `align` (a power of two) and returns the address (zeroed: a
    /// fresh memfd is zero, and nothing is handed out twice).
    pub fn alloc(&self, bytes: usize, align: usize) -> Result<u64> {
        let mut used = self.used.lock();
        let off = used.next_multiple_of(align.max(1));
        let end = off
            .checked_add(bytes.max(1))
            .filter(|&e| e <= self.len)
            .ok_or_else(|| {
                shm_err(
                    self.owner,
                    "shared window",
                    format!("{bytes} more bytes do not fit ({} of {} used)", *used, self.len),
                )
            })?;
        *used = end;
        Ok(self.base + off as u64)
    }
}

impl Drop for SharedArena {
    fn drop(&mut self) {
        if let Some(p) = NonNull::new(self.base as *mut std::ffi::c_void) {
            // SAFETY: we mapped exactly this range; nothing in this process uses it any more.
            let _ = unsafe { munmap(p, self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_shared_between_two_mappings_and_taken_ranges_are_refused() {
        let (at, len) = window(DEFAULT_VA_BASE + (7 << 40), 3, 1 << 20);
        let a = SharedArena::create(3, at, len).unwrap();
        let x = a.alloc(100, 64).unwrap();
        assert_eq!(x, at);
        let y = a.alloc(8, 4096).unwrap();
        assert_eq!(y, at + 4096);
        // SAFETY: inside the window.
        unsafe { (y as *mut u64).write(0x1234) };
        // The same memfd at another address sees the write.
        let dup = a.fd.try_clone().unwrap();
        let b = SharedArena::import(0, 3, dup, at + (1 << 30), len).unwrap();
        // SAFETY: inside b's window.
        assert_eq!(unsafe { ((b.base() + 4096) as *const u64).read_volatile() }, 0x1234);
        // Mapping over a's window again is refused, not silently replaced.
        let dup = a.fd.try_clone().unwrap();
        let e = SharedArena::import(0, 3, dup, at, len).unwrap_err();
        assert!(e.to_string().contains("IBGDA_SHM_VA_BASE"), "{e}");
        assert!(a.alloc(1 << 20, 1).is_err(), "the window is full");
    }
}
