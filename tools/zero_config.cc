// zero-config: check a DeepSpeed-style JSON config the way zero reads it, and print the effective config.
//
//   zero-config ds_config.json             # exit 0 + effective config (defaults filled, "auto" kept) on stdout
//   zero-config ds_config.json --world 8   # also Validate for 8 ranks: derived batch keys, no "auto" left
//   zero-config hf.json --set train_micro_batch_size_per_gpu=4 --set optimizer.params.lr=3e-4 --world 8
//                                          # Config::Set the keys first, checked together (a value is JSON; a bare
//                                          # word is a string)
//   zero-config --default                  # Config::Default() with every default filled in
//   zero-config --reference > docs/guide/config.md   # the markdown reference generated from the schema table
//
// Invalid configs exit 1 with every problem on stderr (key path, value, rule), as do configs that ask for
// DeepSpeed features zero does not implement (said so on stderr); bad usage exits 2. Warnings
// (deprecated spellings, ignored DeepSpeed sections, keys without effect) go to stderr through zero's logger.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "zero/config.h"

namespace {

constexpr const char* kUsage =
    "usage: zero-config FILE [--set KEY=VALUE]... [--world N]\n"
    "                                      check FILE (\"-\" reads stdin) and print the effective config;\n"
    "                                      --set overrides a key (repeatable; VALUE is JSON, a bare word a string)\n"
    "       zero-config --default          print Config::Default()\n"
    "       zero-config --reference        print the config reference (docs/guide/config.md)\n";

int Usage(const std::string& why) {
  if (!why.empty()) std::cerr << "zero-config: " << why << "\n";
  std::cerr << kUsage;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file;
  int world = 0;
  bool reference = false, defaults = false;
  std::vector<std::pair<std::string, std::string>> sets;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--reference") {
      reference = true;
    } else if (a == "--default") {
      defaults = true;
    } else if (a == "--world") {
      if (i + 1 >= argc) return Usage("--world needs a value");
      char* end = nullptr;
      long w = std::strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || w < 1 || w > (1 << 24)) {
        return Usage(std::string("--world: not a positive integer: ") + argv[i]);
      }
      world = static_cast<int>(w);
    } else if (a == "--set") {
      if (i + 1 >= argc) return Usage("--set needs a value (KEY=VALUE)");
      std::string kv = argv[++i];
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) return Usage("--set: not KEY=VALUE: " + kv);
      sets.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    } else if (a.size() > 1 && a[0] == '-' && a != "-") {
      return Usage("unknown flag " + a);
    } else if (file.empty()) {
      file = a;
    } else {
      return Usage("more than one FILE");
    }
  }
  if (reference + defaults + !file.empty() != 1) return Usage("give exactly one of FILE, --default, --reference");
  if (world != 0 && file.empty()) return Usage("--world goes with FILE");
  if (!sets.empty() && file.empty()) return Usage("--set goes with FILE");

  if (reference) {
    std::cout << zero::ConfigReferenceMarkdown();
    return 0;
  }
  if (defaults) {
    std::cout << zero::Config::Default().ToJson(2) << "\n";
    return 0;
  }
  zero::StatusOr<zero::Config> cfg = [&]() -> zero::StatusOr<zero::Config> {
    if (file == "-") {
      std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
      return zero::Config::FromJsonString(text);
    }
    return zero::Config::FromJsonFile(file);
  }();
  if (!cfg.ok()) {
    // A DeepSpeed-valid config that zero cannot run is not "invalid": say which it is.
    const bool unimplemented = cfg.status().code() == absl::StatusCode::kUnimplemented;
    std::cerr << "zero-config: " << (unimplemented ? "not implemented in zero" : "invalid config") << ":\n"
              << cfg.status().message() << "\n";
    return 1;
  }
  // All the --set values in one Config::Set, the rules between keys checked once on the result: keys that name
  // each other (zero_hpz_partition_size needs stage 3) are accepted in either order, as in a file.
  std::vector<std::pair<std::string, std::string>> json_sets;
  for (const auto& [key, value] : sets) json_sets.emplace_back(key, zero::SetValueJson(value));
  if (zero::Status s = cfg->Set(json_sets); !s.ok()) {
    const bool unimplemented = s.code() == absl::StatusCode::kUnimplemented;
    std::cerr << "zero-config: --set: " << (unimplemented ? "not implemented in zero" : "invalid") << ":\n"
              << s.message() << "\n";
    return 1;
  }
  if (world != 0) {
    zero::Status s = cfg->Validate(world);
    if (!s.ok()) {
      std::cerr << "zero-config: invalid for world size " << world << ":\n" << s.message() << "\n";
      return 1;
    }
  }
  std::cout << cfg->ToJson(2) << "\n";
  return 0;
}
