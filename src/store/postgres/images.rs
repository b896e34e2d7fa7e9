//! Image bytes on PostgreSQL: the `images` table, one row per image keyed
//! by its SHA-256, shared by every replica. Written by the writer task in
//! the batch's transaction (so an image is committed when its job is
//! acknowledged), in key order: two replicas storing the same images wait
//! for each other's uncommitted rows in one order (see `super::lock_order`).

use std::sync::Arc;

use super::Conn;
use crate::store::{missing_image, CallRecord, StoreError, StoredImage};

/// Inserts the images in key order, skipping keys already stored (or
/// stored meanwhile by another replica).
const PUT_SQL: &str = "INSERT INTO images (sha256, mime, width, height, bytes) \
     SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::BIGINT[], $5::BYTEA[]) \
       AS i(sha256, mime, width, height, bytes) ORDER BY sha256 \
     ON CONFLICT (sha256) DO NOTHING";

/// The first of the keys `$1` that no stored image has.
const MISSING_SQL: &str = "SELECT u.k FROM unnest($1::TEXT[]) AS u(k) \
     WHERE NOT EXISTS (SELECT 1 FROM images i WHERE i.sha256 = u.k) ORDER BY u.k LIMIT 1";

const GET_SQL: &str = "SELECT mime, width, height, bytes FROM images WHERE sha256 = $1";

/// Stores `images` (several jobs' at once, in any order) in one statement.
pub(super) async fn put(conn: &mut Conn, images: &[&StoredImage]) -> Result<(), StoreError> {
    let mut images = images.to_vec();
    images.sort_by(|a, b| a.sha256.cmp(&b.sha256));
    images.dedup_by(|a, b| a.sha256 == b.sha256);
    if images.is_empty() {
        return Ok(());
    }
    let keys: Vec<&str> = images.iter().map(|i| i.sha256.as_str()).collect();
    let mimes: Vec<&str> = images.iter().map(|i| i.mime.as_str()).collect();
    let widths: Vec<i64> = images.iter().map(|i| i64::from(i.width)).collect();
    let heights: Vec<i64> = images.iter().map(|i| i64::from(i.height)).collect();
    let bytes: Vec<&[u8]> = images.iter().map(|i| i.bytes.as_slice()).collect();
    let stmt = conn.prep(PUT_SQL).await?;
    conn.client
        .execute(&stmt, &[&keys, &mimes, &widths, &heights, &bytes])
        .await?;
    Ok(())
}

/// Refuses the run when a call of it names an image not stored (committed,
/// or put earlier in this transaction): one query for the run's distinct
/// images, none for a run of text calls.
pub(super) async fn check(conn: &mut Conn, calls: &[&CallRecord]) -> Result<(), StoreError> {
    let mut keys: Vec<&str> = calls.iter().flat_map(|c| c.image_keys()).collect();
    if keys.is_empty() {
        return Ok(());
    }
    keys.sort_unstable();
    keys.dedup();
    let stmt = conn.prep(MISSING_SQL).await?;
    let Some(row) = conn.client.query_opt(&stmt, &[&keys]).await? else {
        return Ok(());
    };
    let key: String = row.try_get(0)?;
    match calls
        .iter()
        .find(|c| c.images.iter().any(|i| i.sha256 == key))
    {
        Some(call) => Err(missing_image(call, &key)),
        None => Err(StoreError::Invalid(format!("image {key} is not stored"))),
    }
}

/// The image stored under `sha256`, if any.
pub(super) async fn get(conn: &mut Conn, sha256: &str) -> Result<Option<StoredImage>, StoreError> {
    let stmt = conn.prep(GET_SQL).await?;
    let Some(row) = conn.client.query_opt(&stmt, &[&sha256]).await? else {
        return Ok(None);
    };
    let side = |col: &str| -> Result<u32, StoreError> {
        let v: i64 = row.try_get(col)?;
        u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("image {sha256}: {col} {v}")))
    };
    Ok(Some(StoredImage {
        sha256: sha256.to_string(),
        mime: row.try_get("mime")?,
        width: side("width")?,
        height: side("height")?,
        bytes: Arc::new(row.try_get("bytes")?),
    }))
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::super::bulk::tests::{call, database_at, jobs};
    use super::super::rows::{load, Key};
    use super::super::writer;
    use crate::store::group_commit::{Job, Op};
    use crate::store::{Bodies, CallImage, CallRecord, StoreError, StoredImage};

    fn image(seed: u8) -> StoredImage {
        StoredImage::new("image/png", 3, 2, vec![seed; 4096])
    }

    fn naming(mut c: CallRecord, image: &StoredImage) -> CallRecord {
        c.images = vec![CallImage {
            sha256: image.sha256.clone(),
            mime: image.mime.clone(),
            width: image.width,
            height: image.height,
            grid_thw: [1, 4, 6],
            offset: 0,
            tokens: 1,
        }];
        c
    }

    fn put_job(images: Vec<StoredImage>) -> Job {
        let (ack, _) = oneshot::channel();
        Job {
            op: Op::PutImages(images),
            ack: Some(ack),
        }
    }

    /// A run of appends long enough for the bulk `COPY`, queued before the
    /// images they name: the lock order puts the images first, the run
    /// commits whole, and each call reads back with its references.
    #[tokio::test]
    async fn a_bulk_run_finds_the_images_of_its_own_batch() {
        let (_, mut conn) = database_at().await;
        let (a, b) = (image(1), image(2));
        let run: Vec<CallRecord> = (0..10)
            .map(|i| {
                naming(
                    call("bulk", i, i.checked_sub(1)),
                    if i % 2 == 0 { &a } else { &b },
                )
            })
            .collect();
        let mut batch = jobs(run.clone());
        batch.push(put_job(vec![b.clone()]));
        batch.push(put_job(vec![a.clone(), b.clone()]));
        let out = writer::commit_batch(&mut conn, &mut batch).await;
        assert!(out.iter().all(Result::is_ok), "{out:?}");
        let t = load(&mut conn, Key::Id("bulk"), Bodies::Read)
            .await
            .expect("load")
            .expect("stored");
        assert_eq!(t.calls, run);
        for want in [&a, &b] {
            let got = super::get(&mut conn, &want.sha256).await.expect("get");
            assert_eq!(got.as_ref(), Some(want));
        }
        let n: i64 = conn
            .client
            .query_one("SELECT count(*) FROM images", &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(n, 2);
    }

    /// One call of a bulk run naming an image not stored fails alone.
    #[tokio::test]
    async fn a_call_naming_an_unknown_image_fails_alone_in_a_bulk_run() {
        let (_, mut conn) = database_at().await;
        let (stored, unknown) = (image(3), image(4));
        let mut batch = vec![put_job(vec![stored.clone()])];
        batch.extend(jobs(
            (0..10)
                .map(|i| {
                    let image = if i == 7 { &unknown } else { &stored };
                    naming(call(&format!("t{i}"), 0, None), image)
                })
                .collect(),
        ));
        let out = writer::commit_batch(&mut conn, &mut batch).await;
        for (k, o) in out.iter().enumerate() {
            // Sorted: the put first, then the trajectories by id.
            match (k, o) {
                (8, Err(StoreError::Invalid(m))) => assert!(m.contains(&unknown.sha256), "{m}"),
                (8, other) => panic!("{other:?}"),
                (_, o) => assert!(o.is_ok(), "{k}: {o:?}"),
            }
        }
        assert!(load(&mut conn, Key::Id("t7"), Bodies::Read)
            .await
            .expect("load")
            .is_none());
    }
}
