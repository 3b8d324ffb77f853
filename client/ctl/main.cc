// hisparse-ctl: look at and steer a running hisparsed.
//
// THE COMMAND TABLE below is the single definition of every command: CLI parsing, `--help`, the
// shell completion (`hisparse-ctl completion bash|zsh`) and the man page (`hisparse-ctl man`) are
// all generated from it.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "ctl.h"
#include "hisparse/common/socket_access.h"
#include "hisparse/common/version.h"

namespace hisparse::ctl {

std::shared_ptr<grpc::Channel> ConnectChannel(const GlobalOptions& g) {
  if (g.daemon.rfind("unix:", 0) != 0) {
    std::fprintf(stderr, "hisparse-ctl: --daemon must be unix:PATH, got \"%s\"\n", g.daemon.c_str());
    return nullptr;
  }
  auto channel = grpc::CreateChannel(g.daemon, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::milliseconds(g.timeout_ms))) {
    const std::string why = DescribeUnreachableSocket(g.daemon);
    std::fprintf(stderr, "hisparse-ctl: cannot reach hisparsed at %s%s%s\n", g.daemon.c_str(), why.empty() ? "" : ": ",
                 why.c_str());
    return nullptr;
  }
  return channel;
}

std::unique_ptr<v1::HiSparse::Stub> Connect(const GlobalOptions& g) {
  auto channel = ConnectChannel(g);
  return channel ? v1::HiSparse::NewStub(channel) : nullptr;
}

std::unique_ptr<grpc::ClientContext> Context(const GlobalOptions& g) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(g.timeout_ms));
  return ctx;
}

int ReportRpcError(const grpc::Status& s, const char* what) {
  std::fprintf(stderr, "hisparse-ctl: %s: %s\n", what, s.error_message().c_str());
  const auto code = s.error_code();
  if (code == grpc::StatusCode::PERMISSION_DENIED) {
    std::fprintf(stderr,
                 "hisparse-ctl: permission denied: this needs the daemon's admin role (root, the daemon's user, or "
                 "a uid/gid in access.admin_uids / access.admin_gids); other users see and act on their own "
                 "sessions only\n");
  } else if (code == grpc::StatusCode::UNAUTHENTICATED) {
    std::fprintf(stderr, "hisparse-ctl: the daemon could not tell who this caller is; retry\n");
  }
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ? kExitUnreachable
                                                                                              : kExitRefused;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Percent(double ratio) { return absl::StrFormat("%.1f%%", 100.0 * ratio); }

namespace {

struct Command {
  const char* name;
  const char* synopsis;  // arguments, for the man page and usage
  const char* help;
  void (*options)(CLI::App*, CommandOptions*);
  int (*run)(const GlobalOptions&, const CommandOptions&);
};

void NoOptions(CLI::App*, CommandOptions*) {}

const std::vector<Command>& Commands() {
  static const std::vector<Command> commands = {
      {"status", "", "health, version, uptime, devices, pool and arena totals", NoOptions, StatusCommand},
      {"stats", "", "per pool and GPU: capacity, used, free, fragmentation; per session: requests, bytes, hit rate",
       NoOptions, StatsCommand},
      {"sessions", "", "open sessions: engine, GPU, geometry, requests, memory (a tenant sees its own)", NoOptions,
       SessionsCommand},
      {"requests", "[--session ID]", "admitted requests, of every session or one (a tenant sees its own)",
       [](CLI::App* a, CommandOptions* o) { a->add_option("--session", o->session, "only this session's"); },
       RequestsCommand},
      {"evict", "REQUEST --session ID [--reason TEXT]",
       "take a request away (its engine is told first, then its memory is released); an admin, or the request's own "
       "tenant",
       [](CLI::App* a, CommandOptions* o) {
         a->add_option("request", o->request, "request id")->required();
         a->add_option("--session", o->session, "the session holding it")->required();
         a->add_option("--reason", o->reason, "told to the engine");
       },
       EvictCommand},
      {"drain", "[--no-wait] [--timeout SECONDS] | --cancel",
       "admin: stop admitting, wait for sessions to end; the daemon then exits 75, a restart for its service manager. "
       "--cancel ends a drain: the daemon admits again and no longer exits once idle",
       [](CLI::App* a, CommandOptions* o) {
         CLI::Option* no_wait = a->add_flag("--no-wait", o->no_wait, "return once draining has begun");
         CLI::Option* timeout =
             a->add_option("--timeout", o->drain_timeout_s, "give up waiting after this many seconds");
         a->add_flag("--cancel", o->cancel, "cancel a drain: admit again, and do not exit once idle")
             ->excludes(no_wait)
             ->excludes(timeout);
       },
       DrainCommand},
      {"watch", "[--interval SECONDS] [--count N]", "a live, refreshing view of stats, like top",
       [](CLI::App* a, CommandOptions* o) {
         a->add_option("--interval", o->interval_s, "seconds between refreshes")->check(CLI::PositiveNumber);
         a->add_option("--count", o->count, "stop after N refreshes (0: never)");
       },
       WatchCommand},
      {"config", "", "the daemon's effective configuration (YAML)", NoOptions, ConfigCommand},
      {"groups", "", "TP groups: ranks and their sessions, requests, shares, host bytes counted once", NoOptions,
       GroupsCommand},
  };
  return commands;
}

const char* kGlobalFlags[] = {"--daemon", "--json", "--timeout-ms", "--help"};

// The flags each command takes, read from the options its table entry adds (so the completion
// cannot drift from the parser): "--session --reason --json --help".
std::string CommandFlags(const Command& c) {
  CLI::App sub;
  CommandOptions unused;
  sub.add_flag("--json", "machine-readable JSON output");
  c.options(&sub, &unused);
  std::string flags;
  for (const CLI::Option* opt : sub.get_options()) {
    for (const std::string& name : opt->get_lnames()) flags += "--" + name + " ";
  }
  return flags;
}

int Completion(const std::string& shell) {
  std::string names;
  for (const Command& c : Commands()) names += std::string(c.name) + " ";
  names += "completion man";
  std::string flags;
  for (const char* f : kGlobalFlags) flags += std::string(f) + " ";
  // Per command: its flags after the command word; `completion` takes a shell name.
  std::string bash_cases, zsh_cases;
  for (const Command& c : Commands()) {
    const std::string f = CommandFlags(c);
    bash_cases += absl::StrFormat("    %s) words=\"%s\" ;;\n", c.name, f);
    zsh_cases += absl::StrFormat("    %s) compadd -- %s ;;\n", c.name, f);
  }
  if (shell == "bash") {
    std::printf(
        "# bash completion for hisparse-ctl (generated by `hisparse-ctl completion bash`)\n"
        "_hisparse_ctl() {\n"
        "  local cur=${COMP_WORDS[COMP_CWORD]} cmd=\"\" words i\n"
        "  # The command is the first word after the global flags (--daemon and --timeout-ms take a value).\n"
        "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
        "    case ${COMP_WORDS[i]} in\n"
        "      --daemon|--timeout-ms) ((i++)) ;;\n"
        "      -*) ;;\n"
        "      *) cmd=${COMP_WORDS[i]}; break ;;\n"
        "    esac\n"
        "  done\n"
        "  case $cmd in\n"
        "    \"\") words=\"%s %s\" ;;\n"
        "%s"
        "    completion) words=\"bash zsh\" ;;\n"
        "    *) words=\"\" ;;\n"
        "  esac\n"
        "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
        "}\n"
        "complete -F _hisparse_ctl hisparse-ctl\n",
        names.c_str(), flags.c_str(), bash_cases.c_str());
    return kExitOk;
  }
  if (shell == "zsh") {
    std::printf(
        "#compdef hisparse-ctl\n# generated by `hisparse-ctl completion zsh`\n"
        "_hisparse_ctl() {\n"
        "  local cmd=\"\" i\n"
        "  for ((i = 2; i < CURRENT; i++)); do\n"
        "    case ${words[i]} in\n"
        "      --daemon|--timeout-ms) ((i++)) ;;\n"
        "      -*) ;;\n"
        "      *) cmd=${words[i]}; break ;;\n"
        "    esac\n"
        "  done\n"
        "  case $cmd in\n"
        "    \"\") compadd -- %s %s ;;\n"
        "%s"
        "    completion) compadd -- bash zsh ;;\n"
        "  esac\n"
        "}\n"
        "compdef _hisparse_ctl hisparse-ctl\n",
        names.c_str(), flags.c_str(), zsh_cases.c_str());
    return kExitOk;
  }
  std::fprintf(stderr, "hisparse-ctl: completion for bash or zsh, not \"%s\"\n", shell.c_str());
  return kExitUsage;
}

int ManPage() {
  std::printf(
      ".TH HISPARSE-CTL 8 \"\" \"hisparse\" \"hisparse manual\"\n.SH NAME\nhisparse-ctl \\- look at and steer a "
      "running hisparsed\n");
  std::printf(
      ".SH SYNOPSIS\n.B hisparse-ctl\n[\\-\\-daemon unix:PATH] [\\-\\-json] [\\-\\-timeout-ms MS] COMMAND [ARGS]\n");
  std::printf(".SH COMMANDS\n");
  for (const Command& c : Commands()) std::printf(".TP\n.B %s %s\n%s\n", c.name, c.synopsis, c.help);
  std::printf(".TP\n.B completion bash|zsh\nprint a shell completion script\n.TP\n.B man\nprint this page\n");
  std::printf(
      ".SH OPTIONS\n.TP\n.B \\-\\-daemon unix:PATH\nthe daemon's socket (default $HISPARSE_DAEMON, else "
      "unix:/run/hisparse/hisparsed.sock)\n.TP\n.B \\-\\-json\nmachine-readable output\n.TP\n.B \\-\\-timeout-ms "
      "MS\ndeadline for reaching the daemon and each call\n");
  std::printf(
      ".SH EXIT STATUS\n0 ok; 1 the daemon said no; 2 the daemon cannot be reached; 64 (EX_USAGE) bad usage; 77 "
      "(EX_NOPERM) this user may not open the daemon's socket (not in its group).\n");
  return kExitOk;
}

}  // namespace
}  // namespace hisparse::ctl

int main(int argc, char** argv) {
  using hisparse::ctl::CommandOptions;
  using hisparse::ctl::GlobalOptions;
  CLI::App app{"hisparse-ctl: look at and steer a running hisparsed"};
  app.set_version_flag("--version", "hisparse-ctl " HISPARSE_VERSION);
  app.require_subcommand(1);
  GlobalOptions g;
  if (const char* env = std::getenv("HISPARSE_DAEMON"); env != nullptr && *env) g.daemon = env;
  app.add_option("--daemon", g.daemon,
                 "daemon address, unix:PATH (default $HISPARSE_DAEMON or /run/hisparse/hisparsed.sock)");
  app.add_flag("--json", g.json, "machine-readable JSON output");
  app.add_option("--timeout-ms", g.timeout_ms, "deadline for reaching the daemon and each call");
  CommandOptions o;
  std::vector<std::pair<CLI::App*, const hisparse::ctl::Command*>> subs;
  for (const auto& c : hisparse::ctl::Commands()) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    sub->add_flag("--json", g.json, "machine-readable JSON output");
    c.options(sub, &o);
    subs.emplace_back(sub, &c);
  }
  CLI::App* completion = app.add_subcommand("completion", "print a shell completion script (bash or zsh)");
  completion->add_option("shell", o.shell, "bash or zsh");
  CLI::App* man = app.add_subcommand("man", "print the man page");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help, the version, or what was wrong
    return rc == 0 ? 0 : hisparse::ctl::kExitUsage;
  }
  if (completion->parsed()) return hisparse::ctl::Completion(o.shell);
  if (man->parsed()) return hisparse::ctl::ManPage();
  if (g.daemon.rfind("unix:", 0) != 0) {
    std::fprintf(stderr, "hisparse-ctl: --daemon must be unix:PATH, got \"%s\"\n", g.daemon.c_str());
    return hisparse::ctl::kExitUsage;
  }
  for (auto& [sub, c] : subs) {
    if (!sub->parsed()) continue;
    // Every command talks to the daemon: a socket this user may not open is said at once, with
    // its own exit status, rather than as "cannot reach" after the timeout.
    if (const absl::Status access = hisparse::CheckSocketAccess(g.daemon); !access.ok()) {
      std::fprintf(stderr, "hisparse-ctl: %s\n", std::string(access.message()).c_str());
      return hisparse::ctl::kExitNoPermission;
    }
    return c->run(g, o);
  }
  return hisparse::ctl::kExitUsage;
}
