//! Files the one-shot commands write and read for the user, safe in a folder someone else
//! prepared: an output is created new beside its target (`O_CREAT|O_EXCL` under a temporary
//! name, so never through a link planted there) and renamed over it, relative to the folder
//! opened once; an input is opened without following a final link and without waiting (a FIFO
//! opens at once), and must be a regular file.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context as _, bail};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// Distinguishes the temporary names of one process (with its id).
static TEMP_COUNTER: AtomicU32 = AtomicU32::new(0);
/// Tries at a free temporary name before giving up (names taken by planted files).
const TEMP_ATTEMPTS: u32 = 16;

/// A folder receiving files: each is staged under a temporary name and all are renamed over
/// their targets by [`OutputDir::commit`]; staged files not committed are deleted on drop.
pub(crate) struct OutputDir {
    path: PathBuf,
    dir: OwnedFd,
    /// (temporary name, target name), in order.
    staged: Vec<(String, String)>,
}

impl OutputDir {
    /// Opens `path` (created when `create` and missing). The folder itself is the user's
    /// choice and may be a link; what is inside is not followed.
    pub(crate) fn open(path: &Path, create: bool) -> anyhow::Result<Self> {
        if create {
            std::fs::create_dir_all(path)
                .with_context(|| format!("creating {}", path.display()))?;
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let dir = rustix::fs::open(path, flags, Mode::empty())
            .with_context(|| format!("opening folder {}", path.display()))?;
        Ok(Self {
            path: path.to_owned(),
            dir,
            staged: Vec::new(),
        })
    }

    /// Writes `bytes` to a new file beside `name`, to be renamed over it by `commit`.
    pub(crate) fn stage(&mut self, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
        use std::io::Write as _;
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            bail!(
                "{:?} is not a file name (writing into {})",
                name,
                self.path.display()
            );
        }
        let (temp, fd) = self.create_temp(name)?;
        self.staged.push((temp.clone(), name.to_owned()));
        File::from(fd)
            .write_all(bytes)
            .with_context(|| format!("writing {}", self.path.join(&temp).display()))
    }

    /// A new file `.<name>.<pid>-<n>.tmp`; a name already taken (by anything, a link
    /// included) is never opened, the next is tried.
    fn create_temp(&self, name: &str) -> anyhow::Result<(String, OwnedFd)> {
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        for _ in 0..TEMP_ATTEMPTS {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let temp = format!(".{name}.{}-{n}.tmp", std::process::id());
            match rustix::fs::openat(&self.dir, temp.as_str(), flags, Mode::from_raw_mode(0o644)) {
                Ok(fd) => return Ok((temp, fd)),
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("creating {}", self.path.join(&temp).display()));
                }
            }
        }
        bail!(
            "creating a temporary file for {} in {}: every name tried is taken",
            name,
            self.path.display()
        )
    }

    /// Renames every staged file over its target (a link there is replaced, not followed);
    /// returns the targets' paths.
    pub(crate) fn commit(mut self) -> anyhow::Result<Vec<PathBuf>> {
        let staged = std::mem::take(&mut self.staged);
        let mut written = Vec::with_capacity(staged.len());
        for (i, (temp, name)) in staged.iter().enumerate() {
            if let Err(e) = rustix::fs::renameat(&self.dir, temp.as_str(), &self.dir, name.as_str())
            {
                // What is not renamed yet is deleted with the failure.
                self.staged = staged[i..].to_vec();
                return Err(e).with_context(|| {
                    format!(
                        "renaming {} to {}",
                        self.path.join(temp).display(),
                        self.path.join(name).display()
                    )
                });
            }
            written.push(self.path.join(name));
        }
        Ok(written)
    }
}

impl Drop for OutputDir {
    fn drop(&mut self) {
        for (temp, _) in &self.staged {
            let _ = rustix::fs::unlinkat(&self.dir, temp.as_str(), AtFlags::empty());
        }
    }
}

/// Writes `bytes` to `path` as [`OutputDir`] does: a new file beside it renamed over it.
pub(crate) fn write_replacing(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: not a file name", path.display()))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut dir = OutputDir::open(parent, false)?;
    dir.stage(name, bytes)?;
    dir.commit().map(drop)
}

/// Opens `path` for reading: a final link is not followed and a FIFO or device does not
/// block the open; anything but a regular file is refused, naming the path.
pub(crate) fn open_regular(path: &Path) -> anyhow::Result<File> {
    match rustix::fs::open(path, READ_PLAIN, Mode::empty()) {
        Ok(fd) => regular(fd, path),
        Err(e) => Err(not_opened(path, e)),
    }
}

/// Opens `path`, an absolute path without links or `..` (as `fs::canonicalize` gives it),
/// one component at a time from `/`, following no link: a folder swapped for a link after
/// the path was resolved and checked is refused, never followed. The last component is
/// opened as [`open_regular`] opens a file.
pub(crate) fn open_resolved(path: &Path) -> anyhow::Result<File> {
    use std::path::Component;
    let mut components = path.components();
    if components.next() != Some(Component::RootDir) {
        bail!("{}: not an absolute path", path.display());
    }
    let names = components
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            _ => Err(anyhow::anyhow!("{}: not a resolved path", path.display())),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let Some((last, folders)) = names.split_last() else {
        bail!("{}: not a regular file (a folder): refused", path.display());
    };
    // O_PATH: a folder is passed through as a lookup would, without read permission.
    let through = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open("/", through, Mode::empty()).map_err(|e| not_opened(path, e))?;
    for name in folders {
        dir = rustix::fs::openat(&dir, *name, through, Mode::empty())
            .map_err(|e| not_opened(path, e))?;
    }
    match rustix::fs::openat(&dir, *last, READ_PLAIN, Mode::empty()) {
        Ok(fd) => regular(fd, path),
        Err(e) => Err(not_opened(path, e)),
    }
}

/// Read-only, no link followed, no wait for a writer (FIFO) or a device.
const READ_PLAIN: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC);

fn not_opened(path: &Path, errno: rustix::io::Errno) -> anyhow::Error {
    match errno {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => anyhow::anyhow!(
            "{}: a symbolic link or not a folder on the way (not followed)",
            path.display()
        ),
        e => anyhow::anyhow!("{}: {}", path.display(), std::io::Error::from(e)),
    }
}

/// `fd` as a file when `fstat` of the opened handle says it is a regular file.
fn regular(fd: OwnedFd, path: &Path) -> anyhow::Result<File> {
    let stat = rustix::fs::fstat(&fd).with_context(|| format!("{}", path.display()))?;
    let kind = FileType::from_raw_mode(stat.st_mode);
    if kind != FileType::RegularFile {
        bail!(
            "{}: not a regular file ({}): refused",
            path.display(),
            describe(kind)
        );
    }
    Ok(File::from(fd))
}

fn describe(kind: FileType) -> &'static str {
    match kind {
        FileType::Directory => "a folder",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice | FileType::BlockDevice => "a device",
        FileType::Symlink => "a symbolic link",
        _ => "not a plain file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_replace_a_planted_link_and_never_write_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        // Links at the target and at the temporary names a writer might pick.
        std::os::unix::fs::symlink(&victim, out.join("p.yaml")).unwrap();
        for n in 0..4 {
            let temp = format!(".p.yaml.{}-{n}.tmp", std::process::id());
            std::os::unix::fs::symlink(&victim, out.join(temp)).unwrap();
        }
        let mut staged = OutputDir::open(&out, false).unwrap();
        staged.stage("p.yaml", b"new").unwrap();
        assert_eq!(staged.commit().unwrap(), vec![out.join("p.yaml")]);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(out.join("p.yaml")).unwrap(), "new");
        assert!(
            !std::fs::symlink_metadata(out.join("p.yaml"))
                .unwrap()
                .is_symlink()
        );
        for bad in ["", ".", "..", "../x", "a/b"] {
            let mut staged = OutputDir::open(&out, false).unwrap();
            assert!(staged.stage(bad, b"x").is_err(), "{bad}");
        }
    }

    #[test]
    fn staged_files_not_committed_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let mut staged = OutputDir::open(dir.path(), false).unwrap();
        staged.stage("a.yaml", b"a").unwrap();
        drop(staged);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn inputs_are_regular_files_opened_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(open_regular(&file).is_ok());
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let err = open_regular(&link).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        let fifo = dir.path().join("fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        // Without O_NONBLOCK this open would wait for a writer forever.
        let err = open_regular(&fifo).unwrap_err().to_string();
        assert!(err.contains("a FIFO"), "{err}");
        let err = open_regular(dir.path()).unwrap_err().to_string();
        assert!(err.contains("a folder"), "{err}");
    }

    #[test]
    fn resolved_paths_are_opened_without_following_any_link_on_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(base.join("suite")).unwrap();
        std::fs::write(base.join("suite/r.yaml"), "inside").unwrap();
        std::fs::create_dir(base.join("outside")).unwrap();
        std::fs::write(base.join("outside/r.yaml"), "secret").unwrap();
        let checked = base.join("suite/r.yaml");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut open_resolved(&checked).unwrap(), &mut text).unwrap();
        assert_eq!(text, "inside");
        // The folder swapped for a link out after the path was checked.
        std::fs::rename(base.join("suite"), base.join("moved")).unwrap();
        std::os::unix::fs::symlink(base.join("outside"), base.join("suite")).unwrap();
        let err = open_resolved(&checked).unwrap_err().to_string();
        assert!(err.contains("not followed"), "{err}");
        assert!(std::fs::read_to_string(&checked).unwrap() == "secret");
        for bad in ["relative/r.yaml", "/a/../r.yaml", "/"] {
            assert!(open_resolved(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
