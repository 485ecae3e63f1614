//! The embedded store's files (`store.kind = embedded`): redb databases under `store.path`, one
//! per owner — `coordinator.redb` for the coordinator's tasks, and [`group_file`] for each event
//! subscriber group (its dedup set and its own state: the analytics counters in
//! `analytics.redb`, the tag index in `tag-indexer.redb`, the notification dedup set in
//! `notification.redb`).
//!
//! redb allows one open handle per file per process, and `imagepipe run` runs every service in
//! one process: [`EmbeddedDb::open`] hands every opener of a file in the process the same handle
//! (so a subscriber's dedup set and its store share one file, and one transaction can write
//! both). A standalone service opens only its own files. Every transaction runs on the blocking
//! thread pool ([`EmbeddedDb::blocking`], [`EmbeddedDb::write`], [`EmbeddedDb::read`]), never on
//! an async worker thread.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use redb::{Database, ReadTransaction, ReadableDatabase, WriteTransaction};

/// The files open in this process, by path, while anyone holds them.
static OPEN: Mutex<BTreeMap<PathBuf, Weak<Database>>> = Mutex::new(BTreeMap::new());

/// An embedded database file could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// The directory of the file could not be created or resolved.
    #[error("creating the store directory {}", dir.display())]
    Directory {
        /// The directory (`store.path`).
        dir: PathBuf,
        /// What the file system said.
        #[source]
        source: std::io::Error,
    },
    /// redb failed.
    #[error("{operation} in {}", path.display())]
    Database {
        /// What was being done.
        operation: &'static str,
        /// The database file.
        path: PathBuf,
        /// What redb said.
        #[source]
        source: Box<redb::Error>,
    },
    /// The blocking task running a transaction panicked or was cancelled.
    #[error("{operation} in {} did not finish", path.display())]
    Interrupted {
        /// What was being done.
        operation: &'static str,
        /// The database file.
        path: PathBuf,
        /// Why the task ended.
        #[source]
        source: tokio::task::JoinError,
    },
    /// A subscriber group's name cannot name a file.
    #[error("subscriber group {group:?} cannot name a store file: use letters, digits, '-' and '_'")]
    GroupName {
        /// The group.
        group: String,
    },
}

/// The file under `store_path` holding subscriber group `group`'s state: `<group>.redb`. Group
/// names are `[A-Za-z0-9_-]` (as the bus requires); any other is refused.
pub fn group_file(store_path: &Path, group: &str) -> Result<PathBuf, EmbeddedError> {
    let valid = !group.is_empty() && group.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid {
        return Err(EmbeddedError::GroupName { group: group.to_owned() });
    }
    Ok(store_path.join(format!("{group}.redb")))
}

/// The database files under `store_path` another process has open (redb lets one process open a
/// file): checked before a start that would fail on them half-way, and by `imagepipe doctor`.
/// Files this process has open, files that do not open for another reason (the real open
/// reports those) and a missing directory count as free.
pub fn held_by_another_process(store_path: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(store_path) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "redb") && path.is_file())
        .collect();
    files.sort();
    let open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
    files
        .into_iter()
        .filter(|path| {
            let ours = path.canonicalize().ok().and_then(|p| open.get(&p).and_then(Weak::upgrade)).is_some();
            !ours && matches!(Database::open(path), Err(redb::DatabaseError::DatabaseAlreadyOpen))
        })
        .collect()
}

/// One redb database file, shared by every part of the process that opened it; clones share it.
#[derive(Clone)]
pub struct EmbeddedDb {
    db: Arc<Database>,
    path: Arc<Path>,
}

impl std::fmt::Debug for EmbeddedDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedDb").field("path", &self.path).finish_non_exhaustive()
    }
}

impl EmbeddedDb {
    /// Opens the database file `path`, creating it and its directory when new; the handle is
    /// the one already open in this process when there is one.
    pub fn open(path: &Path) -> Result<Self, EmbeddedError> {
        let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let directory = |source| EmbeddedError::Directory { dir: dir.to_owned(), source };
        std::fs::create_dir_all(dir).map_err(directory)?;
        let file_name = path.file_name().ok_or_else(|| {
            directory(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} names no file", path.display()),
            ))
        })?;
        let path: Arc<Path> = dir.canonicalize().map_err(directory)?.join(file_name).into();
        let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|_, db| db.strong_count() > 0);
        if let Some(db) = open.get(path.as_ref()).and_then(Weak::upgrade) {
            return Ok(Self { db, path });
        }
        let db = Database::create(&path).map_err(|e| EmbeddedError::Database {
            operation: "opening the database",
            path: path.to_path_buf(),
            source: Box::new(e.into()),
        })?;
        let db = Arc::new(db);
        open.insert(path.to_path_buf(), Arc::downgrade(&db));
        Ok(Self { db, path })
    }

    /// Opens subscriber group `group`'s file under `store_path` ([`group_file`]).
    pub fn open_group(store_path: &Path, group: &str) -> Result<Self, EmbeddedError> {
        Self::open(&group_file(store_path, group)?)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The database, for what the helpers here do not cover (tests looking at tables).
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// Runs `f` on the database on the blocking thread pool (`operation` names it in errors).
    pub async fn blocking<R: Send + 'static>(
        &self,
        operation: &'static str,
        f: impl FnOnce(&Database) -> R + Send + 'static,
    ) -> Result<R, EmbeddedError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db)).await.map_err(|source| EmbeddedError::Interrupted {
            operation,
            path: self.path.to_path_buf(),
            source,
        })
    }

    /// Runs `f` in one write transaction on the blocking thread pool and commits it; nothing
    /// of it is written when `f` fails.
    pub async fn write<T: Send + 'static>(
        &self,
        operation: &'static str,
        f: impl FnOnce(&WriteTransaction) -> Result<T, redb::Error> + Send + 'static,
    ) -> Result<T, EmbeddedError> {
        let written = self
            .blocking(operation, move |db| {
                let txn = db.begin_write()?;
                let value = f(&txn)?;
                txn.commit()?;
                Ok(value)
            })
            .await?;
        written.map_err(|source| self.failed(operation, source))
    }

    /// Runs `f` in one read transaction on the blocking thread pool.
    pub async fn read<T: Send + 'static>(
        &self,
        operation: &'static str,
        f: impl FnOnce(&ReadTransaction) -> Result<T, redb::Error> + Send + 'static,
    ) -> Result<T, EmbeddedError> {
        let read = self.blocking(operation, move |db| f(&db.begin_read()?)).await?;
        read.map_err(|source| self.failed(operation, source))
    }

    /// The error of `operation` failing with `source`.
    pub fn failed(&self, operation: &'static str, source: redb::Error) -> EmbeddedError {
        EmbeddedError::Database { operation, path: self.path.to_path_buf(), source: Box::new(source) }
    }
}

#[cfg(test)]
mod tests {
    use redb::TableDefinition;

    use super::*;

    const TABLE: TableDefinition<&str, u64> = TableDefinition::new("test");

    async fn read(db: &EmbeddedDb) -> Option<u64> {
        db.read("reading", |txn| Ok(txn.open_table(TABLE)?.get("k")?.map(|v| v.value()))).await.unwrap()
    }

    #[tokio::test]
    async fn one_handle_per_file_in_the_process_and_the_file_outlives_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/x.redb");
        let first = EmbeddedDb::open(&path).unwrap();
        let second =
            EmbeddedDb::open(&dir.path().join("nested/../nested/x.redb")).expect("the same handle, not a lock error");
        first
            .write("writing", |txn| {
                txn.open_table(TABLE)?.insert("k", 7)?;
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(read(&second).await, Some(7));
        drop((first, second));

        let reopened = EmbeddedDb::open(&path).unwrap();
        assert_eq!(read(&reopened).await, Some(7), "kept in the file");
    }

    #[tokio::test]
    async fn a_failed_write_writes_nothing_and_names_the_operation_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(&dir.path().join("x.redb")).unwrap();
        let failed = db
            .write("writing half", |txn| {
                txn.open_table(TABLE)?.insert("k", 1)?;
                Err::<(), _>(redb::Error::TransactionInProgress)
            })
            .await
            .unwrap_err();
        assert!(failed.to_string().starts_with("writing half in "), "{failed}");
        assert!(failed.to_string().ends_with("x.redb"), "{failed}");
        let missing = db.read("reading", |txn| Ok(txn.open_table(TABLE).is_err())).await.unwrap();
        assert!(missing, "the table was not created");
    }

    #[test]
    fn group_files_are_named_by_the_group() {
        let store = Path::new("/var/lib/imagepipe");
        assert_eq!(group_file(store, "tag-indexer").unwrap(), store.join("tag-indexer.redb"));
        for bad in ["", "../x", "a/b", "a.b"] {
            assert!(matches!(group_file(store, bad), Err(EmbeddedError::GroupName { .. })), "{bad:?}");
        }
    }
}
