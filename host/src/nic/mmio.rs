//! Ordering for what a NIC reads from the CPU's writes: queue entries and doorbell records in
//! memory must be visible before the doorbell store reaches the device, and a doorbell in
//! write-combining memory (a BlueFlame UAR) must be flushed out of the CPU's buffers. These are
//! rdma-core's `udma_to_device_barrier` and `mmio_flush_writes`, per architecture.

/// Orders every earlier store to memory before any later store, as a device sees them.
#[inline(always)]
pub fn before_device_store() {
    #[cfg(target_arch = "x86_64")]
    {
        // x86 keeps stores in order (TSO) for memory and uncached MMIO alike: only the compiler
        // must not move them.
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; it touches no memory and no register.
    unsafe {
        // Outer-shareable store barrier: what a PCIe device observes (`dmb ish` is not enough).
        std::arch::asm!("dmb oshst", options(nostack, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Pushes a doorbell store out of write-combining buffers now (after the doorbell).
#[inline(always)]
pub fn flush_device_stores() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` only orders and drains stores; SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; it touches no memory and no register.
    unsafe {
        std::arch::asm!("dsb st", options(nostack, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}
