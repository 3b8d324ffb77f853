// hisparse-ctl config: the daemon's effective configuration, as YAML, or with --json as one JSON
// object of the same keys ({"host_pool": {"size": "1GiB", ...}, "log_level": "info"}). The last
// reload and the keys pending a restart follow: YAML comments at the end, or the JSON's "reload"
// object (no config key has that name).
#include <cstdio>
#include <string>

#include <grpcpp/grpcpp.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/numbers.h"
#include "ctl.h"

namespace hisparse::ctl {
namespace {

// A YAML node as JSON. Plain scalars that read as integers or booleans become numbers and
// booleans; quoted scalars (tag "!") and everything else stay strings.
bool ToJson(const YAML::Node& node, std::string* out) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      *out += '{';
      bool first = true;
      for (const auto& kv : node) {
        if (!first) *out += ", ";
        first = false;
        *out += JsonString(kv.first.Scalar()) + ": ";
        if (!ToJson(kv.second, out)) return false;
      }
      *out += '}';
      return true;
    }
    case YAML::NodeType::Sequence: {
      *out += '[';
      for (size_t i = 0; i < node.size(); ++i) {
        if (i > 0) *out += ", ";
        if (!ToJson(node[i], out)) return false;
      }
      *out += ']';
      return true;
    }
    case YAML::NodeType::Scalar: {
      const std::string& v = node.Scalar();
      int64_t n = 0;
      const bool plain = node.Tag() != "!";  // quoted scalars are tagged "!": strings whatever they read
      const bool boolean = v == "true" || v == "false";
      const bool integer = !v.empty() && absl::SimpleAtoi(v, &n) && std::to_string(n) == v;
      *out += plain && (boolean || integer) ? v : JsonString(v);
      return true;
    }
    case YAML::NodeType::Null:
      *out += "null";
      return true;
    default:
      return false;
  }
}

}  // namespace

int ConfigCommand(const GlobalOptions& g, const CommandOptions&) {
  auto stub = Connect(g);
  if (stub == nullptr) return kExitUnreachable;
  v1::GetConfigResponse resp;
  grpc::Status st = stub->GetConfig(Context(g).get(), v1::GetConfigRequest(), &resp);
  if (!st.ok()) return ReportRpcError(st, "config");
  if (!g.json) {
    std::fputs(resp.yaml().c_str(), stdout);
    std::printf("\n%s", ReloadLines(resp.reload(), "# last reload: ", "# ").c_str());
    return kExitOk;
  }
  std::string json;
  try {
    if (!ToJson(YAML::Load(resp.yaml()), &json)) throw YAML::Exception(YAML::Mark(), "an undefined node");
    if (json.size() < 2 || json.back() != '}') throw YAML::Exception(YAML::Mark(), "not a map");
  } catch (const YAML::Exception& e) {
    std::fprintf(stderr,
                 "hisparse-ctl: config: the daemon's YAML does not convert to JSON (%s); without --json it "
                 "prints as it is\n",
                 e.what());
    return kExitRefused;
  }
  json.pop_back();  // the reload beside the keys
  std::printf("%s%s\"reload\": %s}\n", json.c_str(), json.size() > 1 ? ", " : "", ReloadJson(resp.reload()).c_str());
  return kExitOk;
}

}  // namespace hisparse::ctl
