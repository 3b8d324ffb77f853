// Fuzz target: hisparsed's config parser. ParseConfigYaml must never crash, hang or throw (an
// exception escaping here terminates the process, which libFuzzer reports), whatever the text.
// When it accepts a document, the documented round trip must hold: RenderConfigYaml of the
// result parses back to an equal config. The first line of the input is also tried as a
// command-line override (KEY=VALUE), which must leave the config unchanged when it fails.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "fuzz_reach.h"
#include "hisparse/daemon/config.h"

using hisparse::fuzz::Fail;
using hisparse::fuzz::Reached;

// What the replay holds the corpus to (fuzz_reach.h): documents parsed and refused, overrides
// applied and refused.
HS_FUZZ_STEP_KINDS("parsed", "refused", "override applied", "override refused")

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<hisparse::DaemonConfig> parsed = hisparse::ParseConfigYaml(text);
  Reached(parsed.ok() ? "parsed" : "refused");
  if (parsed.ok()) {
    const std::string rendered = hisparse::RenderConfigYaml(*parsed);
    absl::StatusOr<hisparse::DaemonConfig> again = hisparse::ParseConfigYaml(rendered);
    if (!again.ok()) Fail("the rendered config does not parse: " + again.status().ToString() + "\n" + rendered);
    if (*again != *parsed) Fail("the rendered config parses to a different config:\n" + rendered);
    (void)hisparse::ListenSocketPath(parsed->listen);
  }

  // KEY=VALUE from the first line, as hisparsed's --set passes it.
  const std::string_view line = text.substr(0, text.find('\n'));
  const size_t eq = line.find('=');
  if (eq != std::string_view::npos) {
    hisparse::DaemonConfig config;
    const hisparse::DaemonConfig before = config;
    absl::Status st = hisparse::ApplyConfigOverride(config, line.substr(0, eq), line.substr(eq + 1));
    Reached(st.ok() ? "override applied" : "override refused");
    if (!st.ok() && config != before) Fail("a failed override changed the config: " + st.ToString());
    if (st.ok()) (void)hisparse::ValidateConfig(config);
  }
  return 0;
}
