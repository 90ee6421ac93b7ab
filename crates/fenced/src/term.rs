//! What long-running commands share with the terminal: a progress bar on standard
//! error, and the interruption (Ctrl-C or SIGTERM) that stops them.

use indicatif::{ProgressBar, ProgressStyle};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A bar of `total` steps labelled `{command} {prefix}`, with a free message after it;
/// hidden by itself when standard error is not a terminal.
pub fn progress_bar(command: &str, total: u64, prefix: String) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let template = format!("{{spinner}} {command} {{prefix}} {{bar:30}} {{msg}}");
    bar.set_style(ProgressStyle::with_template(&template).expect("a valid template").progress_chars("=> "));
    bar.set_prefix(prefix);
    bar
}

/// Shows each progress report from `rx` on `bar` (`show` gives the position and the
/// message) until the sender goes or the task is aborted.
pub fn follow<P>(
    bar: &ProgressBar,
    mut rx: watch::Receiver<P>,
    show: impl Fn(&P) -> (u64, String) + Send + 'static,
) -> JoinHandle<()>
where
    P: Send + Sync + 'static,
{
    let bar = bar.clone();
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let (position, message) = show(&rx.borrow_and_update());
            bar.set_position(position);
            bar.set_message(message);
        }
    })
}

/// Resolves on SIGINT or SIGTERM. Where a handler cannot be installed that signal is
/// left to its default action (the process ends), so this never resolves for it.
pub async fn interrupted() {
    interrupt().await
}

/// The same, with the signal handlers installed now, at the call, rather than when the
/// future is first polled: for a command that tells the user it may be interrupted
/// (it prints a grant) and must then honour a Ctrl-C that comes at once.
pub fn interrupt() -> impl std::future::Future<Output = ()> {
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let mut sigterm = signal(SignalKind::terminate()).ok();
    async move {
        tokio::select! {
            _ = received(sigint.as_mut()) => {}
            _ = received(sigterm.as_mut()) => {}
        }
    }
}

async fn received(s: Option<&mut Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}
