//! Records the git commit the binary is built from (for `trace.bin`'s header), when git can tell:
//! `ESPER_GIT_COMMIT` when set (a build without git, e.g. from a source archive), else
//! `git rev-parse HEAD`. Outside a repository the commit is simply unknown.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok().filter(|o| o.status.success())?;
    String::from_utf8(out.stdout).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=ESPER_GIT_COMMIT");
    // Rebuild when HEAD moves: HEAD itself (a branch switch) and the ref it points at (a commit). In a
    // worktree `.git` is a file, so ask git where these live; a path that does not exist would make
    // cargo rerun this script on every build.
    for path in [
        git(&["rev-parse", "--git-path", "HEAD"]),
        git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r])),
    ]
    .into_iter()
    .flatten()
    {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = std::env::var("ESPER_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_default();
    println!("cargo:rustc-env=ESPER_GIT_COMMIT={commit}");
}
