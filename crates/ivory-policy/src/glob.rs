//! `matchImageReferences[].glob`: Kyverno compiles these with gobwas/glob *without separators*,
//! so `*` also matches `/` and `**` means the same as `*`.

use globset::{GlobBuilder, GlobMatcher};

/// Why an image glob does not compile.
#[derive(Debug, thiserror::Error)]
pub enum GlobError {
    /// An empty glob would match nothing; Kyverno rejects it too.
    #[error("glob must not be empty")]
    Empty,
    /// The pattern is not a valid glob (unclosed class, bad escape, ...).
    #[error(transparent)]
    Invalid(#[from] globset::Error),
}

/// Compiles an image glob with gobwas semantics.
pub fn compile_image_glob(pattern: &str) -> Result<GlobMatcher, GlobError> {
    if pattern.is_empty() {
        return Err(GlobError::Empty);
    }
    let glob = GlobBuilder::new(&collapse_stars(pattern))
        .literal_separator(false)
        .backslash_escape(true)
        .build()?;
    Ok(glob.compile_matcher())
}

/// Replaces runs of unescaped `*` by one `*`: without separators they are equivalent, and globset
/// would otherwise give `**` its path-component meaning.
fn collapse_stars(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                out.push(c);
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            }
            '*' if out.ends_with('*') && !out.ends_with("\\*") => {}
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, image: &str) -> bool {
        compile_image_glob(pattern).unwrap().is_match(image)
    }

    #[test]
    fn star_crosses_slashes() {
        assert!(matches(
            "ghcr.io/*",
            "ghcr.io/kyverno/test-verify-image:signed"
        ));
        assert!(matches(
            "ghcr.io/**",
            "ghcr.io/kyverno/test-verify-image:signed"
        ));
        assert!(matches("*", "docker.io/library/nginx:1.27"));
        assert!(matches(
            "ghcr.io/kyverno/test-images/cosign:*",
            "ghcr.io/kyverno/test-images/cosign:signed"
        ));
        assert!(matches(
            "docker.io/kyverno/kyverno*",
            "docker.io/kyverno/kyverno:v1.14.0"
        ));
    }

    #[test]
    fn anchored_and_literal() {
        assert!(!matches("ghcr.io/*", "docker.io/ghcr.io/x"));
        assert!(!matches("ghcr.io/**", "ghcr.io"));
        assert!(!matches("ghcr.io/kyverno/*", "ghcr.io/other/x"));
        assert!(matches("ghcr.io/kyverno/app:v?", "ghcr.io/kyverno/app:v1"));
        assert!(!matches(
            "ghcr.io/kyverno/app:v?",
            "ghcr.io/kyverno/app:v10"
        ));
        assert!(matches("ghcr.io/{a,b}/*", "ghcr.io/b/x"));
        assert!(matches("ghcr.io/[ab]x", "ghcr.io/ax"));
        assert!(matches("ghcr.io/[!ab]x", "ghcr.io/cx"));
        assert!(!matches(r"ghcr.io/\*", "ghcr.io/x"));
        assert!(matches(r"ghcr.io/\*", "ghcr.io/*"));
    }

    #[test]
    fn invalid_globs_are_errors() {
        assert!(matches!(compile_image_glob(""), Err(GlobError::Empty)));
        assert!(matches!(
            compile_image_glob("ghcr.io/[ab"),
            Err(GlobError::Invalid(_))
        ));
        assert!(matches!(
            compile_image_glob("ghcr.io/{a,b"),
            Err(GlobError::Invalid(_))
        ));
    }

    #[test]
    fn collapse_keeps_escapes() {
        assert_eq!(collapse_stars("a/**/b***"), "a/*/b*");
        assert_eq!(collapse_stars(r"a\**"), r"a\**");
    }
}
