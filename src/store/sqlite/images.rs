//! Image bytes in a SQLite store: the `images` table, one row per image,
//! keyed by its SHA-256. Written only by the writer thread (inside the
//! batch's transaction, so an image is durable when its job is
//! acknowledged); read on the read connections.

use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};

use crate::store::{missing_image, CallRecord, StoreError, StoredImage};

/// Stores each image unless one with its key is stored already.
pub(super) fn put(conn: &Connection, images: &[StoredImage]) -> Result<(), StoreError> {
    let mut insert = conn.prepare_cached(
        "INSERT OR IGNORE INTO images (sha256, mime, width, height, bytes) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for image in images {
        insert.execute(params![
            image.sha256,
            image.mime,
            image.width,
            image.height,
            image.bytes.as_slice()
        ])?;
    }
    Ok(())
}

/// Refuses `call` when an image it names is not stored: one key lookup per
/// distinct image (none for a text call).
pub(super) fn check(conn: &Connection, call: &CallRecord) -> Result<(), StoreError> {
    let keys = call.image_keys();
    if keys.is_empty() {
        return Ok(());
    }
    let mut exists = conn.prepare_cached("SELECT 1 FROM images WHERE sha256 = ?1")?;
    for key in keys {
        if !exists.exists(params![key])? {
            return Err(missing_image(call, key));
        }
    }
    Ok(())
}

/// The image stored under `sha256`, if any.
pub(super) fn get(conn: &Connection, sha256: &str) -> Result<Option<StoredImage>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT mime, width, height, bytes FROM images WHERE sha256 = ?1")?
        .query_row(params![sha256], |r| {
            Ok(StoredImage {
                sha256: sha256.to_string(),
                mime: r.get(0)?,
                width: r.get(1)?,
                height: r.get(2)?,
                bytes: Arc::new(r.get(3)?),
            })
        })
        .optional()?)
}
