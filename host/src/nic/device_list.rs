//! Choosing one RDMA device from rdma-core's list, as both real backends open theirs, and
//! rdma-core's errno text for their errors.

use super::mlx5::ffi::{FreeDeviceList, GetDeviceList, GetDeviceName, IbvDevice};
use std::ffi::{c_int, CStr};

/// rdma-core's error as `errno N (text)` (it reports failures through errno).
pub(crate) fn errno_text() -> String {
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(0) | None => "no errno set".into(),
        Some(n) => format!("errno {n} ({e})"),
    }
}

/// `ibv_get_device_list`'s answer, freed when dropped (open a chosen device before that).
pub(crate) struct DeviceList {
    list: *mut *mut IbvDevice,
    n: usize,
    free: FreeDeviceList,
}

impl DeviceList {
    /// The devices rdma-core lists; `Err` is the errno text when it lists none at all.
    ///
    /// # Safety
    /// `get` and `free` are rdma-core's `ibv_get_device_list` and `ibv_free_device_list`, from a
    /// library that stays loaded while the list lives.
    pub(crate) unsafe fn get(get: GetDeviceList, free: FreeDeviceList) -> Result<DeviceList, String> {
        let mut n: c_int = 0;
        // SAFETY: a valid out-pointer (the function is rdma-core's: this function's contract).
        let list = unsafe { get(&mut n) };
        if list.is_null() {
            return Err(errno_text());
        }
        Ok(DeviceList {
            list,
            n: n.max(0) as usize,
            free,
        })
    }

    /// The first device named `wanted` (any name when `None`) that `accept` takes, with its name.
    /// `accept` says why it refuses one (`Err("not mlx5")`); the error lists every device seen,
    /// each with its refusal, or says there is none.
    pub(crate) fn choose(
        &self,
        name_of: GetDeviceName,
        wanted: Option<&str>,
        accept: impl Fn(*mut IbvDevice) -> Result<(), &'static str>,
    ) -> Result<(*mut IbvDevice, String), String> {
        let mut seen = Vec::new();
        for i in 0..self.n {
            // SAFETY: the list holds `n` devices while it lives.
            let dev = unsafe { *self.list.add(i) };
            // SAFETY: a listed device; its name is a NUL-terminated string it owns.
            let name = unsafe { CStr::from_ptr(name_of(dev)) }.to_string_lossy().into_owned();
            match accept(dev) {
                Ok(()) if wanted.is_none_or(|w| w == name) => return Ok((dev, name)),
                Ok(()) => seen.push(name),
                Err(why) => seen.push(format!("{name} ({why})")),
            }
        }
        Err(if seen.is_empty() {
            "no RDMA device on this host".to_string()
        } else {
            format!("not among the devices: {}", seen.join(", "))
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list `get` returned, freed once.
        unsafe { (self.free)(self.list) };
    }
}
