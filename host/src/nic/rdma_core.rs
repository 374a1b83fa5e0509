//! rdma-core loaded at run time (`libibverbs.so.1`, `libmlx5.so.1`), so that a binary builds and
//! runs where rdma-core is absent and says so. Only what the capability probe needs so far; every
//! signature here is checked against `infiniband/verbs.h` and `infiniband/mlx5dv.h` by
//! `host/tests/rdma_core_ffi.rs`.

use libloading::Library;
use std::ffi::{c_char, c_int, CStr};

/// `struct ibv_device` (opaque here).
#[repr(C)]
pub(crate) struct IbvDevice {
    _opaque: [u8; 0],
}

/// `struct ibv_device **ibv_get_device_list(int *num_devices)`.
pub(crate) type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut IbvDevice;
/// `void ibv_free_device_list(struct ibv_device **list)`.
pub(crate) type FreeDeviceList = unsafe extern "C" fn(*mut *mut IbvDevice);
/// `const char *ibv_get_device_name(struct ibv_device *device)`.
pub(crate) type GetDeviceName = unsafe extern "C" fn(*mut IbvDevice) -> *const c_char;
/// `bool mlx5dv_is_supported(struct ibv_device *device)`.
pub(crate) type Mlx5dvIsSupported = unsafe extern "C" fn(*mut IbvDevice) -> bool;

/// The verbs library's name (`IBGDA_LIBIBVERBS` overrides it with a path).
pub const LIBIBVERBS: &str = "libibverbs.so.1";
/// The mlx5 provider's direct-verbs library.
pub const LIBMLX5: &str = "libmlx5.so.1";

/// One RDMA device as rdma-core lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaDevice {
    /// `ibv_get_device_name` (`mlx5_0`, `rxe0`, ...).
    pub name: String,
    /// Whether the mlx5 provider drives it (`mlx5dv_is_supported`); `None` without libmlx5.
    pub mlx5: Option<bool>,
}

/// libibverbs (and libmlx5, when present), loaded.
pub struct RdmaCore {
    // Kept alive: the function pointers below point into them.
    _verbs: Library,
    _mlx5: Option<Library>,
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    mlx5dv_is_supported: Option<Mlx5dvIsSupported>,
}

impl RdmaCore {
    /// Loads libibverbs from `verbs` (a name the dynamic loader resolves, or a path) and libmlx5
    /// if it can be found; the error says what was tried and why it failed.
    pub fn load(verbs: &str) -> Result<RdmaCore, String> {
        Self::load_with(verbs, LIBMLX5)
    }

    /// [`RdmaCore::load`] with libmlx5 from `mlx5` (a name or a path).
    pub fn load_with(verbs: &str, mlx5: &str) -> Result<RdmaCore, String> {
        // SAFETY: loading rdma-core runs its constructors, which only register providers.
        let lib = unsafe { Library::new(verbs) }.map_err(|e| format!("{verbs} not loadable ({e})"))?;
        // SAFETY: the symbols have the types above (checked against the headers by a test).
        let (get_device_list, free_device_list, get_device_name) = unsafe {
            (
                *lib.get::<GetDeviceList>(b"ibv_get_device_list\0")
                    .map_err(|e| format!("{verbs}: {e}"))?,
                *lib.get::<FreeDeviceList>(b"ibv_free_device_list\0")
                    .map_err(|e| format!("{verbs}: {e}"))?,
                *lib.get::<GetDeviceName>(b"ibv_get_device_name\0")
                    .map_err(|e| format!("{verbs}: {e}"))?,
            )
        };
        // SAFETY: as above.
        let mlx5 = unsafe { Library::new(mlx5) }.ok();
        // SAFETY: as above.
        let mlx5dv_is_supported = mlx5.as_ref().and_then(|l| {
            unsafe { l.get::<Mlx5dvIsSupported>(b"mlx5dv_is_supported\0") }
                .ok()
                .map(|s| *s)
        });
        Ok(RdmaCore {
            _verbs: lib,
            _mlx5: mlx5,
            get_device_list,
            free_device_list,
            get_device_name,
            mlx5dv_is_supported,
        })
    }

    /// Whether libmlx5 (mlx5 direct verbs) was found.
    pub fn has_mlx5dv(&self) -> bool {
        self.mlx5dv_is_supported.is_some()
    }

    /// The RDMA devices rdma-core lists (none where the kernel has no RDMA device).
    pub fn devices(&self) -> Vec<RdmaDevice> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; a null list means no devices (or no permission).
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(n.max(0) as usize);
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` device pointers, valid until it is freed below.
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                break;
            }
            // SAFETY: a device of the list; the name is a NUL-terminated string it owns.
            let name = unsafe {
                let p = (self.get_device_name)(dev);
                if p.is_null() {
                    String::from("?")
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            };
            // SAFETY: as above.
            let mlx5 = self.mlx5dv_is_supported.map(|f| unsafe { f(dev) });
            out.push(RdmaDevice { name, mlx5 });
        }
        // SAFETY: the list from ibv_get_device_list, freed once.
        unsafe { (self.free_device_list)(list) };
        out
    }
}
