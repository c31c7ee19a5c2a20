#include "tools/manual_text.h"

#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "src/config/config.h"
#include "src/shm/zone_layout.h"

namespace trafficrate {
namespace {

constexpr char kZoneOptionText[] =
    "the zone (default: $TRAFFICRATE_ZONE, else \"default\"), or the path "
    "of a zone file (another user's zone, or one an earlier version left in "
    "/dev/shm)";

}  // namespace

const char kSummary[] =
    "share one download rate per client across a TCP server's processes";

// What `trafficrate --help` and DESCRIPTION in trafficrate(1) say first.
const std::vector<const char*>& OverviewParagraphs() {
  static const auto* const kParagraphs = new std::vector<const char*>{
      "Shares one download rate per client across every process of a TCP "
      "server (nginx, Apache, forking or threaded servers, anything that "
      "calls libc), by loading libtrafficrate.so into it (LD_PRELOAD). The "
      "library is configured by TRAFFICRATE_* variables (trafficrate(7), "
      "`trafficrate help environment`); the command starts servers with it "
      "and shows and changes what it does.",
  };
  return *kParagraphs;
}

namespace {

std::vector<OptionDoc> ConfigOptionDocs() {
  std::vector<OptionDoc> options;
  for (const Variable& v : Variables()) {
    if (v.option == nullptr) continue;
    // Kept for the program (a deque: its strings never move).
    static auto* const texts = new std::deque<std::string>();
    std::string& text = texts->emplace_back(v.help);
    absl::StrAppend(
        &text, " (", v.name, *v.arg == '\0' ? "=" : "", v.switch_value,
        *v.default_text() != '\0' ? ", default " : "", v.default_text(), ")");
    options.push_back({v.option, v.arg, text.c_str()});
  }
  return options;
}

}  // namespace

std::vector<CommandDoc>* MakeCommandDocs() {
  auto* docs = new std::vector<CommandDoc>{
      {"run",
       "run a server with the library loaded and configured",
       "[OPTIONS] -- COMMAND [ARGS...]",
       {"Runs COMMAND (exec, same pid) with libtrafficrate.so preloaded "
        "(LD_PRELOAD) and configured: every connection it accepts shares its "
        "client's rate with that client's other connections, across all of "
        "the server's processes. Options set the TRAFFICRATE_* variables; "
        "variables already set are kept unless an option overrides them. A "
        "rate (or a rules file, --config) is required; the configuration is "
        "checked with the library's own parser first, and a rules file with "
        "a rule that can never match is refused.",
        "COMMAND is found as execvp finds it (PATH) and looked at first: a "
        "Go program (it makes its system calls itself), a statically linked "
        "one or one of another machine cannot be paced, and run says so in "
        "one line on stderr (of a dynamically linked Go program, the library "
        "says it as it starts), then runs it all the same (a launcher may "
        "start programs that can be paced); see `trafficrate help limits`."},
       {},
       {"trafficrate run --rate 500k -- nginx -g 'daemon off;'",
        "trafficrate run --rate 1m --ports 80,443 -- apache2ctl -D FOREGROUND",
        "trafficrate run --config /etc/trafficrate/rules.conf -- node "
        "server.js"}},
      {"check",
       "validate a configuration and print what it means",
       "[OPTIONS] [-- COMMAND [ARGS...]]",
       {"Validates the configuration a server would get (the TRAFFICRATE_* "
        "variables of this environment, overridden by the options, which are "
        "those of run) and prints what it means; with a rules file "
        "(--config), its rules in the order the library applies them. Exits "
        "1 with the library's own message if it is invalid, or with a "
        "warning naming both rules if a rule can never match (an earlier "
        "one takes every connection it would).",
        "Given the command run would be given (after --), it also looks at "
        "the program, as run does, and exits 1 with one line if it cannot "
        "be found or executed, or cannot be paced (a Go program, a "
        "statically linked one, one of another machine): a check to make "
        "before starting a server. A script is not looked into: what it "
        "starts gets the library."},
       {},
       {"trafficrate check --rate 500k --key peer/24,64 --after 1m",
        "TRAFFICRATE_RATE=500k trafficrate check",
        "trafficrate check --config /etc/trafficrate/rules.conf",
        "trafficrate check --rate 500k -- nginx -g 'daemon off;'"}},
      {"stat",
       "show a zone's clients, connections, shares and bytes",
       "[--zone NAME] [--json | --prometheus] [--top N] [--sort active|bytes]",
       {"Shows a zone: its rate and capacity, and per client key the active "
        "(sending) and registered connections, the current share of each "
        "sending connection, bytes sent, connections served and last "
        "activity; with TRAFFICRATE_CLUSTER, the fleet exchange and each "
        "key's figures across the fleet (`trafficrate help fleet`). Exits 1 "
        "if the zone does not exist or is corrupt."},
       {{"--zone", "NAME|PATH", kZoneOptionText},
        {"--json", "", "one JSON document (exact figures)"},
        {"--prometheus", "",
         "Prometheus text exposition (trafficrate_* "
         "metrics)"},
        {"--top", "N", "only the N first keys"},
        {"--sort", "S",
         "active (default: most sending connections first) or bytes"}},
       {"trafficrate stat --zone web",
        "trafficrate stat --zone web --json --top 10",
        "trafficrate stat --prometheus > "
        "/var/lib/prometheus/node-exporter/trafficrate.prom"}},
      {"top",
       "live view of the busiest clients",
       "[--zone NAME] [--interval SECONDS]",
       {"A live view of the zone's busiest clients: each key's rate over the "
        "last interval against the zone's rate (a bar), its sending and "
        "registered connections and its share; with a cluster, the "
        "cluster's state and each key's sending connections and hosts in "
        "the fleet. Press q (or Ctrl-C) to quit."},
       {{"--zone", "NAME|PATH", kZoneOptionText},
        {"--interval", "S",
         "seconds between refreshes, 0.2 to 60 (default 1)"}},
       {"trafficrate top --zone web --interval 0.5"}},
      {"set",
       "change a zone's rate (or one rule's) while its servers run",
       "[--zone NAME] [--rule NAME] RATE",
       {"Changes a running zone's per-client rate, e.g. `trafficrate set "
        "1m`. Every server process applies it to its sending connections "
        "within milliseconds. A server started later with TRAFFICRATE_RATE "
        "(or a rules file) sets the rates again. A zone whose server has a "
        "rules file takes the rule to change."},
       {{"--zone", "NAME|PATH", kZoneOptionText},
        {"--rule", "NAME", "the rule of the rules file whose rate to change"}},
       {"trafficrate set --zone web 1m",
        "trafficrate set --zone web --rule downloads 250k"}},
      {"reload",
       "make a zone's servers read their rules file again",
       "[--zone NAME] [--config FILE]",
       {"Makes every server process of a zone read its rules file "
        "(TRAFFICRATE_CONFIG) again, without signalling it: the connections "
        "each accepts from then on follow the new rules; existing "
        "connections keep their rule, whose rate the file may change. A rule "
        "keeps its place by name; a new one takes a free one of the zone's "
        "16. It waits (up to 2 s) for every process to answer and says how "
        "many read the file; a process that could not (a file its user may "
        "not read: workers run as another user than the master that read it "
        "at start-up; an invalid file; no rules file at all) keeps the rules "
        "in force, is named with its user and why on stderr, and the "
        "command exits 1, as it does when the zone has no live process."},
       {{"--zone", "NAME|PATH", kZoneOptionText},
        {"--config", "FILE",
         "check FILE first (it should be the servers' file) and reload only "
         "if it is valid and every rule can match"}},
       {"trafficrate reload --zone web --config /etc/trafficrate/rules.conf"}},
      {"gc",
       "release the registrations of processes that died",
       "[--zone NAME]",
       {"Releases the connections registered by processes that died without "
        "closing them (killed with SIGKILL, crashed). Live server processes "
        "do this by themselves within a second; gc is for a zone no live "
        "process watches."},
       {{"--zone", "NAME|PATH", kZoneOptionText}},
       {"trafficrate gc --zone web"}},
      {"rm",
       "remove a zone",
       "[--zone NAME] [--force]",
       {"Removes a zone (its file, see ZONE in trafficrate(7)). Refused while "
        "live "
        "processes are registered in it, unless --force: they keep using it "
        "until they exit, and servers started afterwards create a new, "
        "separate zone. A corrupt zone (see stat) is removed without "
        "--force: its processes pass through already. A zone of another "
        "layout version (made by another trafficrate version, see "
        "--version) is removed only with --force, since its processes "
        "cannot be listed: stop its servers first."},
       {{"--zone", "NAME|PATH", kZoneOptionText},
        {"--force", "", "remove it even though processes use it"}},
       {"trafficrate rm --zone web"}},
      {"help",
       "this text, a command's help, or a topic of trafficrate(7)",
       "[COMMAND | TOPIC]",
       {"Prints the list of commands, a command's --help, or a topic of the "
        "library's manual: environment, rules, zone, logging, guarantees, "
        "limits, fleet."},
       {},
       {"trafficrate help rules"}},
  };
  const std::vector<OptionDoc> config = ConfigOptionDocs();
  for (CommandDoc& doc : *docs) {
    if (std::strcmp(doc.name, "run") != 0 &&
        std::strcmp(doc.name, "check") != 0) {
      continue;
    }
    doc.options = config;
    if (std::strcmp(doc.name, "run") == 0) {
      doc.options.push_back(
          {"--library", "P",
           "the libtrafficrate.so to load (default: the installed one, "
           "found from this program's place: ../lib/<multiarch>/ or ../lib/ "
           "beside it, this program's directory, then the configured "
           "library directory)"});
    }
  }
  return docs;
}

namespace {

// The zone layout version, in words (the tables hold C strings).
const char* LayoutParagraph() {
  static const std::string* const kText = new std::string(absl::StrCat(
      "The zone's layout has a version, ", kZoneLayoutVersion,
      " in this build (`trafficrate --version` says it). A process never "
      "reads or replaces a zone of another layout: servers of another "
      "trafficrate version may use it. After an upgrade to a version with "
      "another layout, the servers started before it keep their zone, and "
      "a server started after it logs that the zone has another layout and "
      "runs unpaced until that zone is gone: stop every server of the zone, "
      "run `trafficrate rm --force --zone NAME`, and start them again; the "
      "first one creates a zone of the new layout."));
  return kText->c_str();
}

}  // namespace

std::vector<TopicDoc>* MakeTopicDocs() {
  return new std::vector<TopicDoc>{
      {"description",
       "DESCRIPTION",
       {"libtrafficrate.so, loaded into an unmodified TCP server with "
        "LD_PRELOAD, makes all connections from one client (by default one "
        "IP address) share one configured download rate across every "
        "process of the server: each sending connection gets its part of a "
        "byte budget the client's connections share (TRAFFICRATE_SHARE=budget, "
        "the default) or max(1, rate / active) (equal), applied by the "
        "kernel's own "
        "TCP pacing (SO_MAX_PACING_RATE), so non-blocking sockets, sendfile, "
        "splice and TLS work exactly as before.",
        "The library interposes accept, accept4, listen, the send family, "
        "sendfile, splice, close and dup; it registers each accepted TCP "
        "connection "
        "in a shared memory zone (ZONE below), counts the client's sending "
        "connections there and pushes each new share to the sibling "
        "connections in every process within milliseconds. A connection "
        "idle for TRAFFICRATE_IDLE takes no share. Sockets passed between "
        "processes (SCM_RIGHTS) and inherited at start-up are followed.",
        "Everything is read once, in the library's constructor (nginx wipes "
        "its workers' environment; the workers inherit what the master "
        "read). The trafficrate(1) command starts servers with the library "
        "(`trafficrate run`), validates a configuration (`check`), shows a "
        "zone (`stat`, `top`) and changes it live (`set`, `reload`)."}},
      {"environment",
       "ENVIRONMENT",
       {"A bad value prints one line naming the variable and the accepted "
        "form, and the server runs exactly as without the library (or, with "
        "TRAFFICRATE_STRICT=1, exits with status 1). The options of "
        "`trafficrate run` and `check` set the same variables."}},
      {"rules",
       "RULES FILE",
       {"A rules file (TRAFFICRATE_CONFIG=/etc/trafficrate/rules.conf, or "
        "`trafficrate run --config FILE`) holds named rules; each accepted "
        "connection is governed by the first rule that matches its local "
        "address and port and its client, decided once at accept. Each "
        "rule's keys are its own. A connection no rule matches passes "
        "through unpaced.",
        "    # /etc/trafficrate/rules.conf\n"
        "    [internal]\n"
        "    clients = 10.0.0.0/8, fd00::/8\n"
        "    rate    = unlimited\n"
        "\n"
        "    [downloads]\n"
        "    listen  = 80, 443, 8000-8099\n"
        "    rate    = 500k\n"
        "    after   = 1m\n"
        "\n"
        "    [api]\n"
        "    listen  = 127.0.0.1:8443, [::1]:8443\n"
        "    key     = peer/24,64\n"
        "    rate    = 2m\n"
        "    burst   = 256k",
        "A section [NAME] starts a rule: 1 to 31 of A-Z a-z 0-9 _ . -, each "
        "name once, at most 16 rules. # or ; starts a comment line; # after "
        "a blank ends a line early. Each field at most once per rule:",
        "= listen: local endpoints, comma-separated (at most 32): 80, "
        "8000-8099, 127.0.0.1:80, [::1]:8080, *:80, or an address alone "
        "(every port). Default: every local address and port.",
        "= clients: client addresses and networks, IPv4 and IPv6 (at most "
        "64). Default: every client.",
        "= exempt: clients the rule matches and leaves unpaced, same form.",
        "= key: as TRAFFICRATE_KEY. Default: peer.",
        "= rate: bytes/s per key (500k, 2m), or `unlimited`: the rule "
        "matches and never paces. Required.",
        "= after: as TRAFFICRATE_AFTER, per connection. Default: 0.",
        "= burst: as TRAFFICRATE_BURST (budget mode).",
        "TRAFFICRATE_ZONE, _ZONE_SIZE, _SHARE, _IDLE, _LOG, _STRICT and "
        "_INHERITED hold for every rule. A bad file is treated like a bad "
        "variable: one line naming the file, line and column. `trafficrate "
        "check --config FILE` prints the rules as applied and refuses a rule "
        "that can never match; `trafficrate reload` makes running servers "
        "read the file again (the connections they accept from then on "
        "follow it); `trafficrate set --rule NAME RATE` changes one rule's "
        "rate live."}},
      {"zone",
       "ZONE",
       {"A zone is a file, NAME (TRAFFICRATE_ZONE), created by the first "
        "process that needs it (nginx's master, before it forks), mode 0600, "
        "owned by the user that started the server, in a directory that only "
        "that user can write: /run/trafficrate for root (when /run is a "
        "tmpfs, else /dev/shm/trafficrate-0), /dev/shm/trafficrate-UID for "
        "other users. Workers that switch to another user inherit the "
        "mapping. It holds the rate, the rules' rates, one slot per client "
        "key, connection and process, and a robust lock taken with a bound.",
        "No other user can take a zone's place: /dev/shm is world-writable, "
        "so anyone may create /dev/shm/trafficrate-UID first, but a "
        "directory there that is not the user's own is never used: the zone "
        "goes to a directory of the user's own with an unguessable name, "
        "/dev/shm/trafficrate-UID.XXXXXX, and the server logs one line "
        "saying what it found. The trafficrate command finds zones in all "
        "these places (root's also finds other users' zones). A new zone's "
        "pages are reserved when it is made: too little room is one line "
        "naming the size and TRAFFICRATE_ZONE_SIZE, and the server runs "
        "unpaced, never crashed.",
        "Every server process of the zone shares it; servers with different "
        "zones are independent. A zone outlives its servers: the next server "
        "with the same name attaches to it (its key setting must match). "
        "`trafficrate rm` removes it; `trafficrate gc` releases the "
        "connections of dead processes.",
        LayoutParagraph(),
        "When the zone is full, new connections pass through unpaced and "
        "are counted (table full in stat). A zone found corrupt is marked "
        "for every process; each unpaces its sockets, stops using it and "
        "logs one line."}},
      {"logging",
       "LOGGING",
       {"The library logs one line per event, \"trafficrate: TEXT\", to "
        "TRAFFICRATE_LOG: stderr (the default), a file, nowhere, or syslog. "
        "A bad variable is reported on stderr whatever TRAFFICRATE_LOG says "
        "(it may be the bad variable itself).",
        "With `syslog` each line goes to /dev/log (journald, rsyslog) as "
        "\"<PRI>trafficrate[PID]: TEXT\": the identifier trafficrate, the pid "
        "of the server process that logs it (the nginx master at start-up, a "
        "worker for what happens in that worker), facility daemon. Read them "
        "with `journalctl -t trafficrate` (`-p warning` for warnings and "
        "errors only). Priorities: err when a configuration is refused or "
        "the library switches itself off (the server then runs unpaced), "
        "warning when some connections run unpaced or a lock stalls (zone "
        "full, fd table full, a corrupt zone, a rule that can never match), "
        "notice for normal events (a reload applied, dead processes' counts "
        "released). If /dev/log is missing or full, the line goes to stderr "
        "instead.",
        "Every target is rate-limited per process: each kind of message at "
        "most once per 10 s, and all messages together at most 10 at once, "
        "then one per second; dropped lines are counted in a \"N message(s) "
        "suppressed\" line before the next one that goes out."}},
      {"guarantees",
       "GUARANTEES",
       {"Rule zero: if the library fails, the server behaves as if it were "
        "not loaded.",
        "* No wait without bound inside the server's calls: the zone lock is "
        "taken with a 15 ms limit in accept, send and close; a process that "
        "holds it and stops costs each other process one such wait, after "
        "which their calls only try the lock and pass through.",
        "* No value in the zone can crash or hang the server: its geometry "
        "is checked at attach and kept in the process, every index read from "
        "it is checked, every chain walk bounded.",
        "* A corrupt zone is noticed (a checksum, a lock no call can take, "
        "counts no process writes) and left.",
        "* Counts heal by themselves when a worker dies (its siblings reap "
        "it within a second), and nothing the library does changes what a "
        "call returns or its errno."}},
      {"limits",
       "LIMITS",
       {"* Not governed: programs linked statically or making their own "
        "system calls (Go), io_uring sends, UDP; a connection's first 10 "
        "segments (the kernel does not pace them); sockets the process did "
        "not accept and no governed process passed it; connections accepted "
        "while the zone is full.",
        "* Programs that bypass libc are not paced at all, and say so in one "
        "line. `trafficrate run` and `check -- COMMAND` look at the program: "
        "a Go program (it makes its system calls itself, even dynamically "
        "linked), a statically linked one (no dynamic loader runs, so "
        "LD_PRELOAD loads nothing) or one of another word size or machine; "
        "check then exits 1. The library says it of a Go program when it "
        "starts, and of a process that holds connections on a port it "
        "listens on that no accept() or accept4() returned (io_uring, a raw "
        "system call), looking 5 s after its first listen() and a few times "
        "later. To pace such a server, put one the library paces in front of "
        "it (nginx as a reverse proxy, run under trafficrate); a static C "
        "or C++ server can be linked dynamically instead, and an io_uring "
        "one configured without io_uring.",
        "* On paths with a minimum RTT under 512 us (loopback, one LAN "
        "segment) Linux builds TSO packets of up to 64 KiB whatever the "
        "pacing rate, so the rate is right on average but arrives in 64 KiB "
        "steps; sysctl net.ipv4.tcp_tso_rtt_log=0 sizes packets from the "
        "pacing rate instead.",
        "* A single-process server killed with SIGKILL leaves its counts in "
        "the zone until another process notices or `trafficrate gc` runs.",
        "* stat's bytes count what the server handed to the kernel."}},
      {"fleet",
       "FLEET",
       {"With TRAFFICRATE_CLUSTER the hosts of a fleet (servers behind one "
        "load balancer, each with its own zone) share each client's rate "
        "through one Redis server: a client whose connections land on "
        "several hosts gets the rule's rate in all, not that rate on each "
        "host. Every host needs the same TRAFFICRATE_CLUSTER, "
        "TRAFFICRATE_CLUSTER_SECRET and TRAFFICRATE_CLUSTER_NAME (by default "
        "the zone name), the same key setting, rules and rates (rules match "
        "across hosts by name), and a host name of its own: a host's id in "
        "Redis is HOST/ZONE, HOST being TRAFFICRATE_CLUSTER_HOST or else the "
        "hostname, and two hosts with one id overwrite each other's figures "
        "(logged; `trafficrate check` shows the id). The secret goes through "
        "the environment only:",
        "    export TRAFFICRATE_CLUSTER_SECRET=\"$(cat "
        "/etc/trafficrate/cluster.secret)\"\n"
        "    trafficrate run --rate 500k --zone web \\\n"
        "        --cluster redis://10.0.0.5:6379/2 --cluster-name shop \\\n"
        "        -- nginx -g 'daemon off;'",
        "One process per zone exchanges for the host (it holds a lease in "
        "the zone). Every 100 ms it sends, in one pipelined round trip, each "
        "key with sending connections here: their number and the key's "
        "demand (in budget mode twice what the key sends while its "
        "controller finds it clearly under its rate, else unbounded), and "
        "reads back the other hosts' figures. Each host's budget for a key "
        "is its weighted max-min share of the rule's rate: every sending "
        "connection on every host is worth one share; a host whose "
        "connections want less keeps what they want and the others split "
        "the rest. The host's connections of the key share that budget as "
        "they would the rate. No call of the server waits for Redis.",
        "Staleness: a join or leave on one host reaches the other hosts' "
        "budgets within two ticks and a round trip (about 0.2 to 0.3 s); a "
        "key new on a host has the full local rate there until its first "
        "exchange (at most a tick). A host's figures expire in Redis 600 ms "
        "after its last exchange, so the share of a host that died goes to "
        "the others within about a second. Expiry is Redis's own: the "
        "hosts' clocks are not compared.",
        "* Redis unreachable, refusing, or silent for 200 ms: the host falls "
        "back. Each key's last share moves linearly to the full local rate "
        "over TRAFFICRATE_CLUSTER_DECAY (10s by default) from the last "
        "exchange; a key without a share has the full local rate. One line "
        "is logged when it falls back and one when Redis answers again; it "
        "reconnects by itself. After the decay a client spread over N hosts "
        "may get N times the rate, as without a cluster.",
        "* The exchanging process dies: another process of the zone takes "
        "the exchange over within 250 ms (a dead holder's lease is free at "
        "once; a live one that stalls keeps it for 500 ms), before the "
        "host's entry in Redis expires; its first pass makes two round "
        "trips (the first learns which hosts there are), so the keys keep "
        "their shares.",
        "* No process of the zone has exchanged for 2 s (stat: stale): every "
        "key has the full local rate.",
        "Redis holds, under trafficrate:NAME: (the cluster name), the set of "
        "host ids (hosts) and one hash per host (host:ID) that expires 600 "
        "ms after its host's last exchange: per key its sending connections "
        "and demand, named by a SipHash-2-4 of the client key and its rule's "
        "name keyed by the secret (16 hex digits), never the client's "
        "address. Each host sends 8 commands per tick and one HMGET per "
        "other host, which reads only the keys this host has. "
        "No TLS: Debian 12's hiredis has none; reach Redis over a trusted "
        "network or a tunnel (stunnel, ssh, WireGuard).",
        "`trafficrate stat` shows the cluster (state connecting, connected, "
        "fallback or stale; peers, the last exchange and its round trip; "
        "exchanges, failures and fallbacks) and per key its sending "
        "connections on all hosts, the hosts where it sends and this host's "
        "share. `trafficrate check` shows the cluster settings. `trafficrate "
        "set` changes one host's zone: run it on every host."}},
  };
}

}  // namespace trafficrate
