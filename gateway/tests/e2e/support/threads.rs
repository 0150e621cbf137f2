//! This process's threads as the kernel sees them (`/proc/self/task`): which ran, and at what
//! niceness.

/// Run time so far (ns, `/proc/self/task/T/schedstat`) of this process's threads named
/// `svc-bulk` at niceness `nice`, and how many there are.
pub fn bulk_threads(nice: i64) -> (u64, usize) {
    let mut ran = 0;
    let mut count = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let dir = task.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        // The fields after the command's closing parenthesis; niceness is the 19th field.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let niceness: Option<i64> = rest.split_whitespace().nth(16).and_then(|f| f.parse().ok());
        if comm.trim() != "svc-bulk" || niceness != Some(nice) {
            continue;
        }
        let sched = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        ran += sched
            .split_whitespace()
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0);
        count += 1;
    }
    (ran, count)
}

/// [`bulk_threads`] once their run time has stopped changing (what ran before has ended): two
/// looks 100 ms apart that agree, within 10 s.
pub async fn settled_bulk_threads(nice: i64) -> (u64, usize) {
    let mut last = bulk_threads(nice);
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let now = bulk_threads(nice);
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("the list threads kept running with nothing to list");
}
