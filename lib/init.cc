// The library's constructor: resolves the real functions, reads the
// configuration once (nginx wipes its workers' environment, so it must be
// read here, before the server forks), opens the zone and installs the
// Governor. Any failure leaves g_governor null: the host runs unpaced.

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "lib/preload.h"
#include "lib/real.h"
#include "src/base/log.h"
#include "src/cluster/cluster_agent.h"
#include "src/config/config.h"
#include "src/config/rules.h"
#include "src/config/rules_file.h"
#include "src/runtime/bypass_watch.h"
#include "src/runtime/fd_table.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"

namespace trafficrate {

ABSL_CONST_INIT std::atomic<Governor*> g_governor{nullptr};
ABSL_CONST_INIT thread_local bool t_in_library = false;

namespace {

constexpr int kMinFdTable = 65536;
constexpr int kMaxFdTable = 1 << 21;

ABSL_CONST_INIT pthread_once_t g_once = PTHREAD_ONCE_INIT;
ABSL_CONST_INIT Logger g_logger;

void ChildAfterFork() {
  if (Governor* gov = g_governor.load(std::memory_order_acquire)) {
    gov->AfterForkChild();
  }
  if (ListenWatch* watch = g_listen_watch.load(std::memory_order_acquire)) {
    watch->AfterForkChild();
  }
}

// Entries for every fd the process may open: the hard limit, which a root
// master may still raise the soft limit to for its workers.
int FdTableCapacity() {
  rlimit limit{};
  rlim_t n = kMinFdTable;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) n = limit.rlim_max;
  if (n == RLIM_INFINITY || n > static_cast<rlim_t>(kMaxFdTable)) {
    n = kMaxFdTable;
  }
  if (n < static_cast<rlim_t>(kMinFdTable)) n = kMinFdTable;
  return static_cast<int>(n);
}

// One line, then pass-through (or exit in strict mode).
void Fail(const Logger& logger, const absl::Status& status, bool strict) {
  const std::string text(status.message());
  logger.Error(
      "%s; %s", text.c_str(),
      strict ? "exiting (TRAFFICRATE_STRICT=1)" : "the server runs unpaced");
  if (strict) _exit(1);
}

void ConfigureLog(const Config& config) {
  if (config.log != LogTarget::kFile) {
    g_logger.Configure(config.log, -1);
    return;
  }
  const int fd = open(config.log_path.c_str(),
                      O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    g_logger.Warning("TRAFFICRATE_LOG: cannot open %s (%s); logging to stderr",
                     config.log_path.c_str(), strerror(errno));
    return;
  }
  g_logger.Configure(LogTarget::kFile, fd);
}

// TRAFFICRATE_CONFIG: the rules go to the Governor, which maps them to the
// zone's rules (Governor::InstallRules). A rule that can never match is
// logged, and kept: it costs nothing.
void ApplyRules(const Config& config, GovernorOptions* options) {
  options->rules_path = config.rules_path;
  options->file_rules = config.rules;
  RulesFile file{config.rules_path, config.rules};
  for (const std::string& line : ShadowedRules(file)) {
    g_logger.Warning("%s: %s", config.rules_path.c_str(), line.c_str());
  }
}

void Initialize() {
  ResolveRealFunctions();
  // Start-up errors go to stderr: the operator must see them, whatever
  // TRAFFICRATE_LOG says (it may be the bad variable itself).
  bool strict = false;
  if (const char* value = getenv(kEnvStrict)) {
    absl::StatusOr<bool> parsed = ParseStrict(value);
    strict = parsed.ok() && *parsed;
  }
  absl::StatusOr<Config> config =
      ParseConfig([](const char* name) -> const char* { return getenv(name); });
  if (!config.ok()) return Fail(g_logger, config.status(), strict);
  if (!config->enabled) return;
  ConfigureLog(*config);
  ZoneOpenNotes notes;
  absl::StatusOr<std::unique_ptr<Zone>> zone =
      Zone::OpenOrCreate(config->zone_name, config->zone_size_bytes,
                         config->rate_bytes_per_sec, config->key, &notes);
  if (!zone.ok()) return Fail(g_logger, zone.status(), strict);
  if (notes.replaced_corrupt) {
    g_logger.Warning(
        "zone %s was corrupt; replaced by a fresh one (servers still using "
        "the old one pass through unpaced until they restart)",
        config->zone_name.c_str());
  }
  if (!notes.placement.empty()) {
    g_logger.Warning("%s", notes.placement.c_str());
  }
  if (!notes.legacy_path.empty()) {
    g_logger.Notice(
        "%s is zone %s of an earlier trafficrate version: servers still "
        "running that version use it, not %s, so their clients are paced "
        "apart from this server's until they restart; remove it with "
        "`trafficrate rm --force --zone %s` once they have stopped",
        notes.legacy_path.c_str(), config->zone_name.c_str(),
        (*zone)->path().c_str(), notes.legacy_path.c_str());
  }
  (*zone)->settings().SetShare(config->share, config->burst_bytes);
  FdTable* table = FdTable::Create(FdTableCapacity());
  if (table == nullptr) {
    return Fail(g_logger,
                absl::ResourceExhaustedError("cannot map the fd table"),
                strict);
  }
  absl::StatusOr<AcceptRules> rules =
      AcceptRules::Make(config->ports, config->exempt);
  if (!rules.ok()) return Fail(g_logger, rules.status(), strict);
  GovernorOptions options;
  options.key = config->key;
  options.rules = *rules;
  options.after_bytes = config->after_bytes;
  options.idle_ns = config->idle_ns;
  options.shape = config->shape;
  if (!config->rules.empty()) ApplyRules(*config, &options);
  if (config->cluster) {
    ClusterAgentOptions cluster;
    cluster.url = config->cluster_url;
    cluster.name = config->cluster_name;
    cluster.secret = config->cluster_secret;
    cluster.host_id = ClusterHostId(config->cluster_host, config->zone_name);
    cluster.decay_ns = config->cluster_decay_ns;
    // Never destroyed, like the Governor.
    options.agent = new ClusterAgent(zone->get(), &g_logger, cluster);
  }
  // Never destroyed: host threads may still send while the process exits.
  auto* gov = new Governor(zone->release(), table, &g_logger, options);
  pthread_atfork(nullptr, nullptr, &ChildAfterFork);
  if (config->inherited) gov->AdoptInherited();
  g_governor.store(gov, std::memory_order_release);
}

void InitializeOnce() {
  t_in_library = true;  // our own calls (dlsym, shm_open) go straight through
  Initialize();
  if (g_governor.load(std::memory_order_acquire) != nullptr) {
    StartBypassChecks(g_logger);
  }
  t_in_library = false;
}

__attribute__((constructor)) void TrafficrateConstructor() {
  EnsureInitialized();
}

}  // namespace

void EnsureInitialized() { pthread_once(&g_once, &InitializeOnce); }

}  // namespace trafficrate
