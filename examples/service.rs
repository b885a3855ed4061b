//! A request server on tokio, built the way services are built, with each
//! connection's shared state in an `Owner`.
//!
//! Every accepted connection gets an id and a `Conn` (its counters) owned
//! by the task that serves it; a table maps ids to `Weak<Conn>`. A request
//! `PING <id>` reaches *another* connection's state: the handler looks the
//! id up, takes a `Ref` with `tryget_live`, holds it across an `.await`
//! (the work), bumps that connection's counter and answers `PONG`; a
//! connection that has closed, or is closing, answers `GONE`. A client that
//! sends `QUIT` closes its own connection: the task removes the entry,
//! kills the `Owner` and awaits the `Killed`, which resolves once every
//! request still holding a `Ref` to it has finished, and answers with the
//! final count. Shutdown does the same for every connection still open,
//! all at once, and the kills share grace periods.
//!
//! The check at the end: the pings counted by the connections' final
//! states (the values their `Killed` futures returned) equal the `PONG`s
//! the clients received, every request got a reply, and every connection
//! was closed and drained. A `Killed` that resolved before the last
//! request holding a `Ref` had left, or a request lost on the way, breaks
//! it; the example then exits 1.
//!
//! Traffic goes only to the loopback address, and the run is bounded in
//! count (`--clients` × `--requests`) and time (`--max-secs`).
//!
//! `cargo run --release --example service -- --clients 64 --requests 500`

use clap::Parser;
use percpu_ref::owned::{Owner, Weak};
use percpu_ref::percpu;
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

#[derive(Parser, Debug)]
#[command(about = "A tokio request server whose per-connection state is an Owner")]
struct Args {
    /// Client connections, all open at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(2..=1024))]
    clients: u64,
    /// Requests each client sends.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    requests: u64,
    /// One client in this many closes its connection itself (`QUIT`)
    /// before shutdown; the others are closed by the shutdown.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1024))]
    quit_every: u64,
    /// Runtime worker threads (default: twice the CPUs).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    workers: Option<u64>,
    /// The whole run's time bound: past it the example stops and fails.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    max_secs: u64,
}

/// One connection's shared state.
#[derive(Default)]
struct Conn {
    /// Requests this connection sent.
    requests: AtomicU64,
    /// Pings other connections sent to it.
    pings: AtomicU64,
}

type Table = RwLock<HashMap<u64, Weak<Conn>>>;

/// How a connection ended, from its task.
struct Closed {
    conn: Conn,
    by_client: bool,
    /// From the kill to the value back.
    drain: Duration,
}

/// Serves one connection until its client quits or disconnects, an I/O
/// error, or the server shuts down; then, whichever it was, removes it
/// from the table, kills its state and awaits the drain.
async fn serve(
    stream: TcpStream,
    id: u64,
    table: Arc<Table>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<Closed> {
    let owner = Owner::new(Conn::default());
    table.write().unwrap().insert(id, owner.downgrade());
    let (rd, mut wr) = stream.into_split();
    let mut lines = BufReader::new(rd).lines();
    let ended = requests(id, &owner, &table, &mut lines, &mut wr, &mut shutdown).await;
    // Close: no lookup finds it from the kill on; the requests inside
    // (other connections' handlers holding a `Ref`) finish first.
    table.write().unwrap().remove(&id);
    let t = Instant::now();
    let conn = owner.kill().await;
    let drain = t.elapsed();
    let by_client = ended?;
    if by_client {
        // Answers a QUIT with the final count (a disconnect finds a closed
        // socket, which is fine).
        let _ = wr
            .write_all(format!("BYE {}\n", conn.pings.load(Relaxed)).as_bytes())
            .await;
    }
    Ok(Closed {
        conn,
        by_client,
        drain,
    })
}

/// The connection's requests, until the client quits or disconnects
/// (true) or the server shuts down (false).
async fn requests(
    id: u64,
    owner: &Owner<Conn>,
    table: &Table,
    lines: &mut Lines<BufReader<OwnedReadHalf>>,
    wr: &mut OwnedWriteHalf,
    shutdown: &mut watch::Receiver<bool>,
) -> std::io::Result<bool> {
    wr.write_all(format!("ID {id}\n").as_bytes()).await?;
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line?,
            _ = shutdown.changed() => return Ok(false),
        };
        let Some(line) = line else { return Ok(true) };
        if line == "QUIT" {
            return Ok(true);
        }
        let Some(target) = line
            .strip_prefix("PING ")
            .and_then(|t| t.parse::<u64>().ok())
        else {
            wr.write_all(b"ERR\n").await?;
            continue;
        };
        owner.requests.fetch_add(1, Relaxed);
        // The lookup: a counted reference, or nothing once that connection
        // is closing. The table's lock is not held across the await.
        let peer = table
            .read()
            .unwrap()
            .get(&target)
            .and_then(Weak::tryget_live);
        let reply = match peer {
            Some(peer) => {
                // The request's work, with the reference held across an
                // await (it may resume on another worker thread).
                tokio::task::yield_now().await;
                peer.pings.fetch_add(1, Relaxed);
                drop(peer);
                format!("PONG {target}\n")
            }
            None => format!("GONE {target}\n"),
        };
        wr.write_all(reply.as_bytes()).await?;
    }
}

/// What a client saw.
#[derive(Default, Debug)]
struct Seen {
    pongs: u64,
    gones: u64,
}

/// A client: sends its pings to pseudo-random connection ids (some not yet
/// open, some closed), reports what it saw, then quits or stays connected
/// until the server closes the connection.
async fn client(
    addr: std::net::SocketAddr,
    args: Arc<Args>,
    n: u64,
    done: mpsc::Sender<Seen>,
) -> std::io::Result<()> {
    let stream = TcpStream::connect(addr).await?;
    let (rd, mut wr) = stream.into_split();
    let mut lines = BufReader::new(rd).lines();
    let hello = lines.next_line().await?.unwrap_or_default();
    let id: u64 = hello
        .strip_prefix("ID ")
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("client {n}: bad greeting {hello:?}")))?;
    let mut seen = Seen::default();
    let mut x = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for _ in 0..args.requests {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Ids are given out from 1; a few past the last are never open.
        let target = x % (args.clients + 2) + 1;
        wr.write_all(format!("PING {target}\n").as_bytes()).await?;
        let reply = lines.next_line().await?.unwrap_or_default();
        if reply.starts_with("PONG ") {
            seen.pongs += 1;
        } else if reply.starts_with("GONE ") {
            seen.gones += 1;
        } else {
            return Err(std::io::Error::other(format!(
                "client {n}: reply {reply:?}"
            )));
        }
    }
    let quits = n.is_multiple_of(args.quit_every);
    if quits {
        wr.write_all(b"QUIT\n").await?;
        let bye = lines.next_line().await?.unwrap_or_default();
        if !bye.starts_with("BYE ") {
            return Err(std::io::Error::other(format!(
                "client {n}: {bye:?} for QUIT"
            )));
        }
    }
    done.send(seen).await.ok();
    if !quits {
        // Connected until the shutdown closes the connection.
        while lines.next_line().await?.is_some() {}
    }
    Ok(())
}

async fn run(args: Arc<Args>) -> Result<(), String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind 127.0.0.1:0: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let table: Arc<Table> = Arc::default();
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let gp_before = percpu::grace_periods();
    let start = Instant::now();

    // The accept loop: one task per connection, until shutdown.
    let acceptor = {
        let (table, mut shutdown) = (table.clone(), shutdown_rx.clone());
        tokio::spawn(async move {
            let mut conns = Vec::new();
            let mut next_id = 1;
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let (stream, _) = accepted.map_err(|e| format!("accept: {e}"))?;
                        conns.push(tokio::spawn(serve(stream, next_id, table.clone(),
                                                      shutdown_rx.clone())));
                        next_id += 1;
                    }
                    _ = shutdown.changed() => break,
                }
            }
            Ok::<_, String>(conns)
        })
    };

    let (done_tx, mut done_rx) = mpsc::channel(args.clients as usize);
    let clients: Vec<_> = (0..args.clients)
        .map(|n| tokio::spawn(client(addr, args.clone(), n, done_tx.clone())))
        .collect();
    drop(done_tx);
    let mut seen = Seen::default();
    for _ in 0..args.clients {
        let s = done_rx
            .recv()
            .await
            .ok_or("a client ended before reporting")?;
        seen.pongs += s.pongs;
        seen.gones += s.gones;
    }
    let served_in = start.elapsed();

    // Shutdown: every connection still open is killed at once, and each
    // task awaits its own drain.
    let t = Instant::now();
    shutdown_tx.send(true).map_err(|e| e.to_string())?;
    let conns = acceptor.await.map_err(|e| e.to_string())??;
    let mut closed = Vec::with_capacity(conns.len());
    for c in conns {
        closed.push(
            c.await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?,
        );
    }
    let drained_in = t.elapsed();
    for c in clients {
        c.await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    let gps = percpu::grace_periods() - gp_before;

    let requests: u64 = closed.iter().map(|c| c.conn.requests.load(Relaxed)).sum();
    let pings: u64 = closed.iter().map(|c| c.conn.pings.load(Relaxed)).sum();
    let by_client = closed.iter().filter(|c| c.by_client).count();
    if closed.len() as u64 != args.clients {
        return Err(format!(
            "{} connections for {} clients",
            closed.len(),
            args.clients
        ));
    }
    let mut drains: Vec<_> = closed.iter().map(|c| c.drain).collect();
    drains.sort();
    println!(
        "service: {} connections on {addr}, backend {}, {} runtime workers",
        closed.len(),
        percpu_ref::backend(),
        args.workers
            .map_or_else(|| "2 x CPUs".into(), |w| w.to_string()),
    );
    println!(
        "  requests served: {requests} ({} PONG, {} GONE) in {:.1} ms",
        seen.pongs,
        seen.gones,
        served_in.as_secs_f64() * 1e3
    );
    println!(
        "  kills: {} ({by_client} closed by their client, {} at shutdown); \
         grace periods: {gps}",
        closed.len(),
        closed.len() - by_client
    );
    println!(
        "  shutdown drained {} connections in {:.2} ms; one connection's kill to value: \
         median {:.1} µs, max {:.1} µs",
        closed.len() - by_client,
        drained_in.as_secs_f64() * 1e3,
        drains[drains.len() / 2].as_secs_f64() * 1e6,
        drains[drains.len() - 1].as_secs_f64() * 1e6,
    );
    println!(
        "  check: pings counted by the connections {pings}, PONGs received {}",
        seen.pongs
    );
    let expected = args.clients * args.requests;
    if requests != expected || seen.pongs + seen.gones != expected {
        return Err(format!(
            "{requests} requests served and {} replies for {expected} sent",
            seen.pongs + seen.gones
        ));
    }
    if pings != seen.pongs {
        return Err(format!(
            "{pings} pings counted, {} PONGs received",
            seen.pongs
        ));
    }
    if closed.len() as u64 != args.clients {
        return Err(format!(
            "{} connections for {} clients",
            closed.len(),
            args.clients
        ));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Arc::new(Args::parse());
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(w) = args.workers {
        rt.worker_threads(w as usize);
    } else {
        rt.worker_threads(num_cpus::get() * 2);
    }
    let rt = rt.build().expect("tokio runtime");
    let bound = Duration::from_secs(args.max_secs);
    let result = rt.block_on(async {
        tokio::time::timeout(bound, run(args.clone()))
            .await
            .unwrap_or_else(|_| Err(format!("not done within --max-secs {}", args.max_secs)))
    });
    // A timed-out run leaves tasks waiting on sockets: do not wait for them.
    rt.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("service: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
