// What shardctl's command line knows of itself, read from the CLI11 app that
// parses it (so it cannot drift from the parser): the nearest subcommand to
// a mistyped one, and bash and zsh completion scripts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace shardline::ctl {

// Edit distance (optimal string alignment: a swap of neighbours is one edit).
int EditDistance(const std::string& a, const std::string& b);

// `args` (argv without the program) walked as `app` would: the first word
// that stands where a subcommand must and names none, as one line
// ("no command 'stauts'; did you mean 'status'?"); nullopt if there is none.
std::optional<std::string> MistypedSubcommand(CLI::App& app, const std::vector<std::string>& args);

// Scripts completing app's subcommands (nested ones too), flags (a
// subcommand's and its parents'), the values of flags checked with
// CLI::IsMember, and file names for flags and arguments that take a path.
std::string BashCompletion(CLI::App& app);
std::string ZshCompletion(CLI::App& app);

}  // namespace shardline::ctl
