//! Where a command writes a file. Nothing but a regular file or a new path is ever replaced (a
//! device node, FIFO, symbolic link or directory at the path is refused, `force` or not), a
//! write-protected file or directory is refused, problems with the path are found before the
//! work ([`check`]), and a failed write names the file it was for, never a temporary one.

use std::fs::{self, File, FileType, Metadata, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// A destination path that cannot (or may not) be written.
#[derive(Debug, Error)]
pub enum OutputError {
    #[error("{} already exists (overwrite it with force)", path.display())]
    Exists { path: PathBuf },

    /// Replacing it would destroy something that is not a file of ours (the device node itself,
    /// the link rather than its target).
    #[error("{} is {kind}, not a regular file; refusing to write over it", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },

    #[error("{} is write-protected; refusing to replace it", path.display())]
    ReadOnly { path: PathBuf },

    #[error("{} is the input file {}; write to another path", path.display(), input.display())]
    SameAsInput { path: PathBuf, input: PathBuf },

    #[error("cannot write {}: directory {} {problem}", path.display(), dir.display())]
    Directory {
        path: PathBuf,
        dir: PathBuf,
        problem: &'static str,
    },

    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

type Result<T, E = OutputError> = std::result::Result<T, E>;

fn write_err(path: &Path) -> impl FnOnce(io::Error) -> OutputError + '_ {
    |source| OutputError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// "a directory", "a character device", ...: what a non-regular path is.
pub(crate) fn kind(t: FileType) -> &'static str {
    if t.is_symlink() {
        return "a symbolic link";
    }
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "a special file"
}

/// The regular file at `path`, `None` for a new path; anything else is refused. Symbolic links
/// are not followed: replacing one would replace the link, not write its target.
fn existing(path: &Path) -> Result<Option<Metadata>> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => Ok(Some(m)),
        Ok(m) => Err(OutputError::NotRegular {
            path: path.to_path_buf(),
            kind: kind(m.file_type()),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(write_err(path)(e)),
    }
}

/// The rules on the destination itself; true when it exists (and may be replaced).
fn rules(path: &Path, force: bool) -> Result<bool> {
    let Some(m) = existing(path)? else {
        return Ok(false);
    };
    if !force {
        return Err(OutputError::Exists {
            path: path.to_path_buf(),
        });
    }
    if m.permissions().readonly() {
        return Err(OutputError::ReadOnly {
            path: path.to_path_buf(),
        });
    }
    Ok(true)
}

/// The directory `path` is written into, checked: it exists, is a directory, is not
/// write-protected (its mode, so that the rule holds for root too).
fn directory(path: &Path) -> Result<PathBuf> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let problem = match fs::metadata(&dir) {
        Ok(m) if !m.is_dir() => "is not a directory",
        Ok(m) if m.permissions().readonly() => "is write-protected",
        Ok(_) => return Ok(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => "does not exist",
        Err(e) => return Err(write_err(path)(e)),
    };
    Err(OutputError::Directory {
        path: path.to_path_buf(),
        dir,
        problem,
    })
}

/// A new file beside the destination, removed unless renamed onto it.
struct TempFile {
    path: PathBuf,
    file: File,
    kept: bool,
}

impl TempFile {
    /// Created with the usual mode (0666 less the umask), as any new file.
    fn beside(dest: &Path) -> Result<Self> {
        let dir = directory(dest)?;
        let name = dest
            .file_name()
            .map_or_else(|| "output".into(), |n| n.to_string_lossy());
        for n in 0.. {
            let path = dir.join(format!(".{name}.{}-{n}.tmp", std::process::id()));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    return Ok(Self {
                        path,
                        file,
                        kept: false,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(write_err(dest)(e)),
            }
        }
        unreachable!("the counter runs until a name is free")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.kept {
            // Best effort: the file is ours and holds nothing anyone asked for.
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Before any work: `path` may be written under the rules of [`OutputError`], and a file can be
/// created in its directory (a probe file, removed at once: it finds read-only mounts and
/// permissions the mode bits do not show).
pub fn check(path: &Path, force: bool) -> Result<()> {
    rules(path, force)?;
    TempFile::beside(path).map(drop)
}

/// Refuse an output `path` that is the file `input` (compared by device and inode, so another
/// spelling, a hard link or a symbolic link of it is caught too).
pub fn refuse_input(path: &Path, input: &Path) -> Result<()> {
    if same_file(path, input) {
        return Err(OutputError::SameAsInput {
            path: path.to_path_buf(),
            input: input.to_path_buf(),
        });
    }
    Ok(())
}

#[cfg(unix)]
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(a: &Path, b: &Path) -> bool {
    matches!((fs::canonicalize(a), fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
}

/// Write `path` whole or not at all: `write` fills a temporary file in the same directory,
/// which is synced and renamed onto `path` after the rules are checked again (the path may have
/// changed during the work). Without `force` an existing file is refused.
pub fn write_atomic(
    path: &Path,
    force: bool,
    write: impl FnOnce(&mut BufWriter<&File>) -> io::Result<()>,
) -> Result<()> {
    rules(path, force)?;
    let mut tmp = TempFile::beside(path)?;
    let mut w = BufWriter::with_capacity(1 << 20, &tmp.file);
    write(&mut w)
        .and_then(|()| w.flush())
        .map_err(write_err(path))?;
    drop(w);
    tmp.file.sync_all().map_err(write_err(path))?;
    rules(path, force)?;
    fs::rename(&tmp.path, path).map_err(write_err(path))?;
    tmp.kept = true;
    Ok(())
}

/// Open `path` to write as the work goes (JSON lines keep what was written should a run stop):
/// a new path is created, an existing regular file is truncated only with `force`.
pub fn create(path: &Path, force: bool) -> Result<File> {
    check(path, force)?;
    let mut options = OpenOptions::new();
    options.write(true);
    if rules(path, force)? {
        options.truncate(true);
    } else {
        options.create_new(true);
    }
    options.open(path).map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists => OutputError::Exists {
            path: path.to_path_buf(),
        },
        _ => write_err(path)(e),
    })
}
