//! A VFS over SQLite's default (`unix`) one that writes a transaction's WAL
//! frames with one `pwrite(2)` instead of two a frame (SQLite writes each
//! frame's 24-byte header, then its page). The writing connection opens the
//! store through it (`open_writing` in the parent module); every other
//! connection, and every file but the `-wal` one, is the default VFS's own.
//!
//! # What it may hold back, and when it lets go
//!
//! A write to the WAL that continues the last one (the next frame of a
//! transaction) is kept in memory; any other write is written through as it
//! comes: the WAL's header when the WAL starts over (SQLite syncs it before
//! the first frame unless `synchronous=OFF`, which the store does not
//! offer), and the checksum rewrites SQLite makes after a commit frame when
//! the transaction overwrote frames it had spilled (they land at earlier
//! offsets). What is kept is written, with one call of the default VFS's
//! `xWrite`:
//!
//! - when the commit frame's page is written (a frame header whose
//!   "database size" word is not zero is a commit frame's), before that
//!   write returns, and with that write's outcome. SQLite publishes a commit
//!   to other connections (the wal-index header) only after it wrote the
//!   commit frame, so nothing it published is still held back, and an error
//!   fails the commit as a failed write of the frame would;
//! - before any other operation on the file (a read, a sync, a truncation,
//!   its size, a lock, a file control, its close) and before a write that
//!   does not continue the kept bytes. Kept bytes at such a point belong to
//!   no commit yet (a spill, a rolled-back transaction); a failure to write
//!   them is that operation's error, which fails the transaction;
//! - when more than 128 KiB would be kept (a large transaction is written in
//!   pieces of up to that size).
//!
//! A database whose file does not report power-safe overwrite (`psow=0` in
//! a URI) has its WAL written as the default VFS writes it: there, with
//! `synchronous=FULL`, SQLite pads each commit with copies of its commit
//! frame up to a sector's end, syncs before the copy that crosses it and
//! writes that copy's rest after the sync, past the commit frame. SQLite
//! decides that padding from the database file when it opens the WAL, and
//! so does this VFS.
//!
//! So after `COMMIT` returns every frame of the transaction is in the file,
//! as without this VFS (`SqliteStore`'s `kill -9` guarantee), and a process
//! killed mid-transaction leaves less of an uncommitted transaction in the
//! WAL than it would have, which recovery ignores either way.
//!
//! # Why
//!
//! A root call's commit made ~9.6 `pwrite64`s, ~18 µs of the ~300 µs of
//! CPU a call takes in the peers bench's 1-concurrent cell. Joined, a call
//! costs 7 to 14 µs less CPU in four A/B runs and its commit's median is
//! ~3.5 µs shorter (docs/benchmarks-history-late.md, "A transaction's WAL
//! frames in one write").

use std::ffi::{c_int, c_void, CStr};
use std::ptr;
use std::sync::OnceLock;

use rusqlite::ffi;

/// The VFS's registered name.
const NAME: &str = "tito-walbuf";
const NAME_C: &CStr = c"tito-walbuf";

/// Kept bytes past which they are written: the most unix's `xWrite` writes
/// in one call (it masks a write's length with `0x1ffff`; SQLite's own
/// writes are a page at most, 64 KiB).
const LIMIT: usize = 0x1ffff;
/// The size of a WAL frame's header.
const FRAME_HEADER: c_int = 24;

/// Registers the VFS once; `Err` when the default VFS is not SQLite's
/// `unix` one (whose files this one was written against).
pub(crate) fn register() -> Result<&'static str, String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        // SAFETY: `sqlite3_vfs_find` initialises SQLite and returns the
        // default VFS (or null), which lives as long as the process.
        let real = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
        if real.is_null() {
            return Err("SQLite has no default VFS".into());
        }
        // SAFETY: `real` is a registered VFS; its name is a C string.
        let (name, size) = unsafe { (CStr::from_ptr((*real).zName), (*real).szOsFile) };
        if !name.to_bytes().starts_with(b"unix") {
            return Err(format!(
                "the default SQLite VFS is {name:?}, not unix's: WAL writes stay one per header and page"
            ));
        }
        // SAFETY: as above; the copy keeps every method of the default VFS
        // (none of unix's but `xOpen` reads its VFS argument) and answers
        // `xOpen` itself, with room for a `WalFile` before the real file.
        let mut vfs: ffi::sqlite3_vfs = unsafe { ptr::read(real) };
        vfs.szOsFile = (HEADER as c_int) + size;
        vfs.pNext = ptr::null_mut();
        vfs.zName = NAME_C.as_ptr();
        vfs.pAppData = real.cast();
        vfs.xOpen = Some(x_open);
        let vfs = Box::leak(Box::new(vfs));
        // SAFETY: `vfs` is leaked, so it outlives every connection.
        let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 0) };
        if rc != ffi::SQLITE_OK {
            return Err(format!("sqlite3_vfs_register failed with code {rc}"));
        }
        Ok(())
    })
    .clone()
    .map(|()| NAME)
}

/// A `-wal` file opened through this VFS: the state, then the default VFS's
/// file (`real`, at [`HEADER`] bytes). SQLite allocates `szOsFile` bytes
/// for every file; a file that is not a WAL uses them as the default VFS's
/// file alone.
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    /// Bytes written to SQLite but not yet to the file. They end at `next`.
    kept: Vec<u8>,
    /// Just past the last write; where a continuing write starts.
    next: i64,
    /// The last write was a commit frame's header.
    commit_header: bool,
}

/// `WalFile`'s size rounded up to 16, where the default VFS's file starts.
const HEADER: usize = std::mem::size_of::<WalFile>().div_ceil(16) * 16;

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let real_vfs = (*vfs).pAppData.cast::<ffi::sqlite3_vfs>();
    let Some(open) = (*real_vfs).xOpen else {
        return ffi::SQLITE_CANTOPEN;
    };
    if flags & ffi::SQLITE_OPEN_WAL == 0 || !power_safe(name) {
        return open(real_vfs, name, file, flags, out_flags);
    }
    let real = file.cast::<u8>().add(HEADER).cast::<ffi::sqlite3_file>();
    let rc = open(real_vfs, name, real, flags, out_flags);
    if rc != ffi::SQLITE_OK {
        (*file).pMethods = ptr::null();
        return rc;
    }
    ptr::write(
        file.cast::<WalFile>(),
        WalFile {
            base: ffi::sqlite3_file {
                pMethods: &WAL_METHODS,
            },
            real,
            kept: Vec::new(),
            next: -1,
            commit_header: false,
        },
    );
    ffi::SQLITE_OK
}

/// Whether the database of WAL file `name` reports power-safe overwrite,
/// as `sqlite3WalOpen` asks right after opening the WAL: without it SQLite
/// pads commits (see the module's doc).
unsafe fn power_safe(name: ffi::sqlite3_filename) -> bool {
    let db = ffi::sqlite3_database_file_object(name);
    if db.is_null() || (*db).pMethods.is_null() {
        return false;
    }
    methods(db)
        .xDeviceCharacteristics
        .is_some_and(|f| f(db) & ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE != 0)
}

/// The default VFS's methods of `real`.
unsafe fn methods(real: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    &*(*real).pMethods
}

impl WalFile {
    /// Writes what is kept, with one call of the real file's `xWrite`.
    unsafe fn flush(&mut self) -> c_int {
        if self.kept.is_empty() {
            return ffi::SQLITE_OK;
        }
        let start = self.next - self.kept.len() as i64;
        let rc = write_through(self.real, self.kept.as_ptr().cast(), self.kept.len(), start);
        self.kept.clear();
        rc
    }

    unsafe fn write(&mut self, data: *const c_void, amt: c_int, offset: i64) -> c_int {
        let Ok(len) = usize::try_from(amt) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let bytes = std::slice::from_raw_parts(data.cast::<u8>(), len);
        let end = offset + i64::from(amt);
        let continues = offset == self.next;
        // The previous write was a commit frame's header: this is its page.
        let ends_commit = self.commit_header && amt != FRAME_HEADER;
        self.commit_header = amt == FRAME_HEADER && bytes[4..8] != [0; 4];
        if !continues || self.kept.len() + len > LIMIT {
            // `flush` places the kept bytes by `next`: move it only after.
            let rc = self.flush();
            self.next = end;
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            if !continues || len > LIMIT {
                return write_through(self.real, data, len, offset);
            }
        }
        if self.kept.try_reserve(len).is_err() {
            self.kept.clear();
            return ffi::SQLITE_IOERR_NOMEM;
        }
        self.kept.extend_from_slice(bytes);
        self.next = end;
        if ends_commit {
            return self.flush();
        }
        ffi::SQLITE_OK
    }
}

unsafe fn write_through(
    real: *mut ffi::sqlite3_file,
    data: *const c_void,
    len: usize,
    offset: i64,
) -> c_int {
    let (Ok(amt), Some(write)) = (c_int::try_from(len), methods(real).xWrite) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    count_write();
    write(real, data, amt, offset)
}

/// The file behind `file` as a `WalFile`, its kept bytes written first.
/// `Err` holds the write's error code.
unsafe fn flushed<'a>(file: *mut ffi::sqlite3_file) -> Result<&'a mut WalFile, c_int> {
    let wal = &mut *file.cast::<WalFile>();
    match wal.flush() {
        ffi::SQLITE_OK => Ok(wal),
        rc => Err(rc),
    }
}

/// Forwards one method to the real file once the kept bytes are written.
macro_rules! forward {
    ($name:ident, $method:ident, ($($arg:ident: $ty:ty),*)) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
            match flushed(file) {
                Ok(wal) => match methods(wal.real).$method {
                    Some(f) => f(wal.real $(, $arg)*),
                    None => ffi::SQLITE_MISUSE,
                },
                Err(rc) => rc,
            }
        }
    };
}

forward!(x_read, xRead, (data: *mut c_void, amt: c_int, offset: i64));
forward!(x_truncate, xTruncate, (size: i64));
forward!(x_sync, xSync, (flags: c_int));
forward!(x_file_size, xFileSize, (size: *mut i64));
forward!(x_lock, xLock, (level: c_int));
forward!(x_unlock, xUnlock, (level: c_int));
forward!(x_check_reserved_lock, xCheckReservedLock, (out: *mut c_int));
forward!(x_file_control, xFileControl, (op: c_int, arg: *mut c_void));

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amt: c_int,
    offset: i64,
) -> c_int {
    (*file.cast::<WalFile>()).write(data, amt, offset)
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    let wal = file.cast::<WalFile>();
    let flushed = (*wal).flush();
    let real = (*wal).real;
    let closed = match methods(real).xClose {
        Some(close) => close(real),
        None => ffi::SQLITE_OK,
    };
    ptr::drop_in_place(wal);
    (*file).pMethods = ptr::null();
    if flushed != ffi::SQLITE_OK {
        flushed
    } else {
        closed
    }
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let real = (*file.cast::<WalFile>()).real;
    methods(real).xSectorSize.map_or(4096, |f| f(real))
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    let real = (*file.cast::<WalFile>()).real;
    methods(real).xDeviceCharacteristics.map_or(0, |f| f(real))
}

/// Version 1: SQLite maps no shared memory and fetches no pages through a
/// WAL file.
static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

#[cfg(test)]
thread_local! {
    /// Writes this thread's WAL files made to the default VFS (tests).
    static WRITES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
fn count_write() {
    WRITES.with(|w| w.set(w.get() + 1));
}

#[cfg(not(test))]
fn count_write() {}

#[cfg(test)]
#[path = "walbuf_tests.rs"]
mod tests;
