//! Builds a sample cgroup tree with two subsystems, runs tasks that charge
//! pages, migrates them (moving their charges), removes the tree, and
//! prints the recorded css lifecycle.
//!
//! Run: `cargo run --release --features css --example css_lifecycle`

use percpu_ref::css::{EventLog, Hierarchy, Pages, Recorder};

fn main() {
    let log = EventLog::default();
    let h = Hierarchy::new(vec![
        Recorder::with_log("memory", log.clone()),
        Recorder::with_log("io", log.clone()),
    ]);
    let root = h.root();
    let a = h.mkdir(&root, "a").unwrap();
    let b = h.mkdir(&a, "b").unwrap();
    let c = h.mkdir(&a, "c").unwrap();
    let d = h.mkdir(&root, "d").unwrap();
    println!("tree: / /a /a/b /a/c /d, subsystems memory (ssid 0) and io (ssid 1)\n");

    let tb = h.spawn(&b).unwrap();
    let tc = h.spawn(&c).unwrap();
    let mut pages_b = Pages::new();
    let mut pages_c = Pages::new();
    pages_b.charge_task(&tb, 0, 1000);
    pages_c.charge_task(&tc, 0, 500);
    pages_c.charge_task(&tc, 1, 20);
    println!("tb in /a/b charged 1000 pages; tc in /a/c charged 500 memory + 20 io");

    match h.rmdir(&b) {
        Err(e) => println!("rmdir /a/b refused: {e}"),
        Ok(()) => unreachable!(),
    }
    match h.rmdir(&a) {
        Err(e) => println!("rmdir /a refused: {e}"),
        Ok(()) => unreachable!(),
    }

    // Migrate tb to /d with its charges (get_many on /d, put_many on /a/b).
    let from = tb.get_css(0);
    h.attach(&tb, &d).unwrap();
    let to = tb.get_css(0);
    println!(
        "migrated tb to /d, moved {} charges",
        pages_b.move_charge(&from, &to)
    );
    drop((from, to));
    h.attach(&tc, &root).unwrap();
    println!("migrated tc to / (its 520 pages stay charged to /a/c)\n");

    for cg in [&b, &c, &a] {
        h.rmdir(cg).unwrap();
        println!("rmdir {}", cg.path());
    }
    assert!(h.flush());
    println!("after rmdir: /a/b freed; /a/c (pinned by pages) and /a (pinned by /a/c) offline; /d online: css_count {}", h.nr_css());
    drop(pages_c);
    println!("uncharged tc's pages");
    h.attach(&tb, &root).unwrap();
    h.rmdir(&d).unwrap();
    println!("rmdir /d");
    drop(pages_b);
    drop((tb, tc));
    assert!(h.flush());
    println!("flushed: css_count {}\n", h.nr_css());

    println!("recorded lifecycle (in order):");
    for (i, e) in log.lock().unwrap().iter().enumerate() {
        println!("{i:3}  {e}");
    }
}
