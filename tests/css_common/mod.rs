//! Shared checks for the css tests.

use percpu_ref::css::{Event, EventKind};
use std::collections::HashMap;

/// Checks every css in `log` went through exactly Alloc, Online, Offline,
/// Released, Free (the root only Alloc, Online while the hierarchy lives),
/// and that for every parent/child pair the child's offline and free come
/// first. Returns the number of non-root csses checked.
pub fn check_lifecycle(log: &[Event]) -> usize {
    use EventKind::*;
    let mut per_css: HashMap<(String, String), Vec<(usize, EventKind)>> = HashMap::new();
    for (i, e) in log.iter().enumerate() {
        per_css
            .entry((e.subsys.clone(), e.path.clone()))
            .or_default()
            .push((i, e.kind));
    }
    let mut checked = 0;
    for ((ss, path), evs) in &per_css {
        let kinds: Vec<EventKind> = evs.iter().map(|e| e.1).collect();
        if path == "/" {
            assert_eq!(kinds, [Alloc, Online], "root css of {ss}");
            continue;
        }
        // A path can be reused after removal: check each generation.
        assert_eq!(kinds.len() % 5, 0, "{ss} {path}: {kinds:?}");
        for gen in kinds.chunks(5) {
            assert_eq!(gen, [Alloc, Online, Offline, Released, Free], "{ss} {path}");
            checked += 1;
        }
        let parent = match path.rfind('/') {
            Some(0) => "/".to_string(),
            Some(i) => path[..i].to_string(),
            None => unreachable!(),
        };
        if parent == "/" {
            continue;
        }
        let pevs = &per_css[&(ss.clone(), parent.clone())];
        for (i, kind) in evs {
            if *kind == Offline || *kind == Free {
                // The parent generation alive at the child's event must do
                // the same thing later.
                let alloc_before = pevs
                    .iter()
                    .filter(|(j, k)| *k == Alloc && j < i)
                    .map(|(j, _)| *j)
                    .max()
                    .expect("parent allocated before child");
                let parent_same = pevs
                    .iter()
                    .find(|(j, k)| *k == *kind && *j > alloc_before)
                    .map(|(j, _)| *j);
                if let Some(j) = parent_same {
                    assert!(
                        j > *i,
                        "{ss}: {kind:?} of parent {parent} (#{j}) before child {path} (#{i})"
                    );
                }
            }
        }
    }
    checked
}
