//! The audit's progress line on stderr.

use crate::cmd::output;

/// A one-line progress bar on stderr, only when stderr is a terminal.
pub(super) struct Progress {
    enabled: bool,
    label: String,
    total: usize,
    done: usize,
}

impl Progress {
    pub(super) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            label: String::new(),
            total: 0,
            done: 0,
        }
    }

    pub(super) fn start(&mut self, label: &str, total: usize) {
        self.label = label.to_owned();
        self.total = total;
        self.done = 0;
        self.draw();
    }

    /// More images to do (the sources are still being listed).
    pub(super) fn grow(&mut self, n: usize) {
        self.total += n;
        self.draw();
    }

    pub(super) fn inc(&mut self, n: usize) {
        self.done += n;
        self.draw();
    }

    fn draw(&self) {
        if self.enabled {
            eprint!("\r\x1b[2K{}", output::terminal(&self.line()));
        }
    }

    /// `verifying     [#######            ] 12/52`
    fn line(&self) -> String {
        const WIDTH: usize = 30;
        let filled = (self.done * WIDTH)
            .checked_div(self.total)
            .unwrap_or(WIDTH)
            .min(WIDTH);
        let bar = format!("{}{}", "#".repeat(filled), " ".repeat(WIDTH - filled));
        format!("{:<13} [{bar}] {}/{}", self.label, self.done, self.total)
    }

    pub(super) fn clear(&self) {
        if self.enabled {
            eprint!("\r\x1b[2K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_line() {
        let mut p = Progress::new(false);
        p.start("verifying", 4);
        p.inc(1);
        assert_eq!(
            p.line(),
            format!("verifying     [{}{}] 1/4", "#".repeat(7), " ".repeat(23))
        );
        p.start("listing tags", 0);
        assert_eq!(p.line(), format!("listing tags  [{}] 0/0", "#".repeat(30)));
    }
}
