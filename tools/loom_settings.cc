// loom-settings: every environment variable loom reads, from the one registry
// (common/settings_list.h).
//
//   loom-settings              each setting with its value here and now, and where the
//                              value came from (default, LOOM_*, NCCL_*)
//   loom-settings --markdown   the environment reference (docs/environment.md), settings
//                              for users first, then the knobs for measurement and tuning
#include <cstdio>
#include <cstring>
#include <string>

#include "common/settings.h"

namespace {

using loom::settings::Definition;
using loom::settings::Type;
using loom::settings::Use;

// A table cell: no line breaks, and a literal '|' escaped.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

void table(Use use) {
  std::printf("| variable | NCCL name | takes | default | what it does |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  for (const Definition& d : loom::settings::all()) {
    if (d.use != use) continue;
    // (Appends, not "`" + string: GCC 12 warns falsely about that form, -Wrestrict.)
    std::string def = "(empty)";
    if (*d.defaultValue) def = std::string("`").append(cell(d.defaultValue)).append("`");
    std::string alias;
    if (d.ncclAlias) alias.append("`").append(d.ncclAlias).append("`");
    std::printf("| `%s` | %s | %s | %s | %s |\n", d.name, alias.c_str(),
                cell(loom::settings::syntaxOf(d)).c_str(), def.c_str(), cell(d.doc).c_str());
  }
}

void markdown() {
  std::printf(
      "# Environment reference\n\n"
      "Written by `loom-settings --markdown` from the settings registry (common/settings_list.h); "
      "do not edit by hand. Where a setting has an NCCL name, either works and the `LOOM_` "
      "one wins. Booleans take 1/0, on/off, yes/no, true/false in any case. Sizes are bytes, "
      "or a number with K, M, G or T (powers of 1024: `4M`, `256KiB`); where a setting "
      "lists them, `auto` is the measured default for the machine and rank count, `off` "
      "turns the form off and `any` means no limit. Choices take any case. A value that "
      "does not parse keeps the default, with a warning. `loom-settings` prints each "
      "setting's value in the current environment and where it came from.\n\n"
      "## Settings for users\n\n");
  table(Use::kUser);
  std::printf(
      "\n## Knobs for measurement and tuning\n\n"
      "Their defaults come from measurements (docs/perf/); they exist to measure, to tune "
      "a machine unlike ours, and for tests. A job should not need them.\n\n");
  table(Use::kTuning);
}

void current() {
  std::printf("%-32s %-10s %-12s %s\n", "setting", "for", "from", "value");
  for (const Definition& d : loom::settings::all()) {
    std::printf("%-32s %-10s %-12s %s\n", d.name, d.use == Use::kUser ? "users" : "tuning",
                loom::settings::sourceOf(d).c_str(), loom::settings::valueText(d).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--markdown") == 0) {
    markdown();
    return 0;
  }
  if (argc == 1) {
    current();
    return 0;
  }
  std::fprintf(stderr,
               "usage: loom-settings [--markdown]\n"
               "  every setting loom reads, its value here and where it came from;\n"
               "  --markdown: the environment reference (docs/environment.md)\n");
  return 2;
}
