#include "client/command_line.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

namespace shardline::ctl {
namespace {

// An option's or a positional's value, as completion offers it.
struct Value {
  std::string kind = "none";  // "choices", "files" or "none"
  std::vector<std::string> choices;
};

struct Flag {
  std::string name, description;
  bool takes_value = false;
  Value value;
};

// One command level ("shardctl", "shardctl ckpt", "shardctl ckpt save").
struct Level {
  std::string path;
  std::vector<std::pair<std::string, std::string>> subcommands;  // name, description
  std::vector<Flag> flags;         // its own, then its parents' (they fall through)
  std::vector<Value> positionals;  // in order
};

// CLI::IsMember's description is "{a,b,c}".
Value ValueOf(CLI::Option* opt) {
  Value v;
  for (int i = 0;; ++i) {
    CLI::Validator* validator = nullptr;
    try {
      validator = opt->get_validator(i);
    } catch (const CLI::OptionNotFound&) {
      break;
    }
    const std::string d = validator->get_description();
    if (d.size() >= 2 && d.front() == '{' && d.back() == '}') {
      std::stringstream in(d.substr(1, d.size() - 2));
      for (std::string c; std::getline(in, c, ',');) v.choices.push_back(c);
      v.kind = "choices";
      return v;
    }
  }
  // Text other than a job id is a path (a job file, a token file, a step
  // directory); numbers and job ids are not completed.
  const std::string type = opt->get_type_name();
  if (type.rfind("TEXT", 0) == 0 && opt->get_name(true) != "JOB") v.kind = "files";
  return v;
}

std::vector<Flag> FlagsOf(CLI::App* app) {
  std::vector<Flag> out;
  for (CLI::Option* opt : app->get_options()) {
    if (!opt->nonpositional()) continue;
    std::vector<std::string> names;
    for (const auto& l : opt->get_lnames()) names.push_back("--" + l);
    for (const auto& s : opt->get_snames()) names.push_back("-" + s);
    for (const auto& n : names) {
      Flag f;
      f.name = n;
      f.description = opt->get_description();
      f.takes_value = opt->get_items_expected_max() > 0;
      if (f.takes_value) f.value = ValueOf(opt);
      out.push_back(f);
    }
  }
  return out;
}

void Collect(CLI::App* app, const std::string& path, const std::vector<Flag>& inherited, std::vector<Level>* out) {
  Level level;
  level.path = path;
  for (Flag& f : FlagsOf(app)) level.flags.push_back(std::move(f));
  for (const Flag& f : inherited) {
    const bool shadowed = std::any_of(level.flags.begin(), level.flags.end(),
                                      [&](const Flag& own) { return own.name == f.name; });
    if (!shadowed) level.flags.push_back(f);
  }
  for (CLI::Option* opt : app->get_options()) {
    if (!opt->nonpositional()) level.positionals.push_back(ValueOf(opt));
  }
  std::vector<CLI::App*> subs = app->get_subcommands(std::function<bool(CLI::App*)>());
  for (CLI::App* sub : subs) level.subcommands.emplace_back(sub->get_name(), sub->get_description());
  const std::vector<Flag> flags = level.flags;
  out->push_back(std::move(level));
  for (CLI::App* sub : subs) Collect(sub, path + " " + sub->get_name(), flags, out);
}

std::vector<Level> Levels(CLI::App& app) {
  std::vector<Level> out;
  Collect(&app, app.get_name(), {}, &out);
  return out;
}

// 'text' for the shell, in single quotes.
std::string Quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string Join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

// The tables both scripts read: keys are "LEVEL", "LEVEL FLAG" and "LEVEL #N"
// (the Nth positional), as single-quoted assignments `[key]=value` (bash) or
// `key value` pairs (zsh).
struct Tables {
  std::map<std::string, std::string> subs, opts, valued, choices, pos, desc;
};

Tables MakeTables(CLI::App& app, bool zsh) {
  Tables t;
  auto describe = [&](const std::string& text) {
    std::string d = text.substr(0, text.find('\n'));
    if (!zsh) return d;
    std::string out;  // _describe splits NAME:DESCRIPTION at an unescaped colon
    for (char c : d) out += c == ':' ? std::string("\\:") : std::string(1, c);
    return out;
  };
  for (const Level& l : Levels(app)) {
    std::vector<std::string> subs, opts;
    for (const auto& [name, d] : l.subcommands) {
      subs.push_back(name);
      t.desc[l.path + " " + name] = describe(d);
    }
    if (!subs.empty()) t.subs[l.path] = Join(subs);
    for (const Flag& f : l.flags) {
      opts.push_back(f.name);
      t.desc[l.path + " " + f.name] = describe(f.description);
      if (!f.takes_value) continue;
      const std::string key = l.path + " " + f.name;
      t.valued[key] = f.value.kind;
      if (!f.value.choices.empty()) t.choices[key] = Join(f.value.choices);
    }
    t.opts[l.path] = Join(opts);
    for (size_t i = 0; i < l.positionals.size(); ++i) {
      const std::string key = l.path + " #" + std::to_string(i);
      t.pos[key] = l.positionals[i].kind;
      if (!l.positionals[i].choices.empty()) t.choices[key] = Join(l.positionals[i].choices);
    }
  }
  return t;
}

std::string Table(const std::string& decl, const std::string& name, const std::map<std::string, std::string>& m,
                  bool zsh) {
  std::string out = decl + " " + name + "\n" + name + "=(\n";
  for (const auto& [k, v] : m) {
    out += zsh ? "  " + Quote(k) + " " + Quote(v) + "\n" : "  [" + Quote(k) + "]=" + Quote(v) + "\n";
  }
  return out + ")\n";
}

std::string AllTables(CLI::App& app, const std::string& fn, bool zsh) {
  const Tables t = MakeTables(app, zsh);
  const std::string decl = zsh ? "typeset -gA" : "declare -gA";
  std::string out;
  out += Table(decl, fn + "_subs", t.subs, zsh);
  out += Table(decl, fn + "_opts", t.opts, zsh);
  out += Table(decl, fn + "_valued", t.valued, zsh);
  out += Table(decl, fn + "_choices", t.choices, zsh);
  out += Table(decl, fn + "_pos", t.pos, zsh);
  if (zsh) out += Table(decl, fn + "_desc", t.desc, zsh);
  return out;
}

// The program's name as a shell identifier ("shardctl" -> "_shardctl").
std::string FunctionName(const CLI::App& app) {
  std::string out = "_";
  for (char c : app.get_name()) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  for (size_t at = s->find(from); at != std::string::npos; at = s->find(from, at + to.size())) {
    s->replace(at, from.size(), to);
  }
}

}  // namespace

int EditDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<int>> d(a.size() + 1, std::vector<int>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::optional<std::string> MistypedSubcommand(CLI::App& app, const std::vector<std::string>& args) {
  CLI::App* level = &app;
  std::string path;  // the subcommands so far, "ckpt "
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") return std::nullopt;
    if (a.size() > 1 && a[0] == '-') {
      if (a.find('=') != std::string::npos) continue;
      // The option of this level or of a parent (options fall through).
      for (CLI::App* owner = level; owner != nullptr; owner = owner->get_parent()) {
        if (const CLI::Option* opt = owner->get_option_no_throw(a)) {
          if (opt->get_items_expected_max() > 0) ++i;  // its value
          break;
        }
      }
      continue;
    }
    const std::vector<CLI::App*> subs = level->get_subcommands(std::function<bool(CLI::App*)>());
    if (subs.empty()) continue;  // an argument of a leaf
    CLI::App* found = nullptr;
    for (CLI::App* s : subs) {
      if (s->check_name(a)) found = s;
    }
    if (found != nullptr) {
      level = found;
      path += a + " ";
      continue;
    }
    if (!level->get_options([](const CLI::Option* o) { return !o->nonpositional(); }).empty()) continue;
    std::string best;
    int best_distance = 1 << 30;
    std::vector<std::string> names;
    for (CLI::App* s : subs) {
      names.push_back(s->get_name());
      const int d = EditDistance(a, s->get_name());
      if (d < best_distance) {
        best_distance = d;
        best = s->get_name();
      }
    }
    std::string line = "no command '" + path + a + "'";
    // Near enough to be a slip of the fingers rather than another word.
    if (best_distance <= std::max<int>(2, static_cast<int>(best.size()) / 3)) {
      return line + "; did you mean '" + path + best + "'?";
    }
    std::string all;
    for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
    return line + " (" + (path.empty() ? "commands" : path + "commands") + ": " + all + ")";
  }
  return std::nullopt;
}

std::string BashCompletion(CLI::App& app) {
  const std::string fn = FunctionName(app);
  std::string s = R"(# bash completion for PROG, printed by `PROG completion bash`:
#   source <(PROG completion bash)
# or save it as /usr/share/bash-completion/completions/PROG. Generated from
# PROG's own command line (its subcommands, flags and their values).
)";
  std::string body = R"(
FN_fill() {  # FN_fill KEY KIND CUR
  case $2 in
    choices) COMPREPLY=($(compgen -W "${FN_choices[$1]}" -- "$3")) ;;
    files) COMPREPLY=($(compgen -f -- "$3")); compopt -o filenames 2>/dev/null ;;
  esac
}

FN() {
  local cur=${COMP_WORDS[COMP_CWORD]} level=PROG valuefor="" npos=0 w i
  COMPREPLY=()
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    case $w in
      -*=*) ;;
      -*)
        if [[ -n ${FN_valued["$level $w"]+x} ]]; then
          [[ ${COMP_WORDS[i+1]} == = ]] && i=$((i + 1))  # --flag=value, split at '='
          if ((i + 1 == COMP_CWORD)); then valuefor="$level $w"; break; fi
          i=$((i + 1))
        fi ;;
      *)
        if [[ " ${FN_subs[$level]} " == *" $w "* ]]; then
          level="$level $w"; npos=0
        else
          npos=$((npos + 1))
        fi ;;
    esac
  done
  [[ $cur == = ]] && cur=""
  if [[ -n $valuefor ]]; then FN_fill "$valuefor" "${FN_valued[$valuefor]}" "$cur"; return 0; fi
  if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W "${FN_opts[$level]}" -- "$cur")); return 0; fi
  if [[ -n ${FN_subs[$level]} ]]; then COMPREPLY=($(compgen -W "${FN_subs[$level]}" -- "$cur")); return 0; fi
  FN_fill "$level #$npos" "${FN_pos["$level #$npos"]}" "$cur"
  return 0
}

complete -F FN PROG
)";
  for (std::string* t : {&s, &body}) {  // not the tables: descriptions are free text
    ReplaceAll(t, "FN", fn);
    ReplaceAll(t, "PROG", app.get_name());
  }
  return s + AllTables(app, fn, false) + body;
}

std::string ZshCompletion(CLI::App& app) {
  const std::string fn = FunctionName(app);
  std::string s = R"(#compdef PROG
# zsh completion for PROG, printed by `PROG completion zsh`: save it as _PROG
# in a directory of $fpath, or after compinit: source <(PROG completion zsh).
# Generated from PROG's own command line (its subcommands, flags and their
# values).
)";
  std::string body = R"(
FN_fill() {  # FN_fill KEY KIND
  case $2 in
    choices) compadd -- ${(s: :)FN_choices[$1]} ;;
    files) _files ;;
  esac
}

FN() {
  local level=PROG valuefor="" w i npos=0
  local -a items
  for ((i = 2; i < CURRENT; i++)); do
    w=${words[i]}
    case $w in
      -*=*) ;;
      -*)
        if [[ -n ${FN_valued[$level $w]} ]]; then
          if ((i + 1 == CURRENT)); then valuefor="$level $w"; break; fi
          i=$((i + 1))
        fi ;;
      *)
        if [[ " ${FN_subs[$level]} " == *" $w "* ]]; then
          level="$level $w"; npos=0
        else
          npos=$((npos + 1))
        fi ;;
    esac
  done
  if [[ -n $valuefor ]]; then FN_fill "$valuefor" "${FN_valued[$valuefor]}"; return; fi
  if [[ ${words[CURRENT]} == -* ]]; then
    for w in ${(s: :)FN_opts[$level]}; do items+=("$w:${FN_desc[$level $w]}"); done
    _describe -t options 'option' items
    return
  fi
  if [[ -n ${FN_subs[$level]} ]]; then
    for w in ${(s: :)FN_subs[$level]}; do items+=("$w:${FN_desc[$level $w]}"); done
    _describe -t commands 'PROG command' items
    return
  fi
  FN_fill "$level #$npos" "${FN_pos[$level #$npos]}"
}

if [[ ${funcstack[1]} == FN ]]; then
  FN "$@"
else
  compdef FN PROG
fi
)";
  for (std::string* t : {&s, &body}) {
    ReplaceAll(t, "FN", fn);
    ReplaceAll(t, "PROG", app.get_name());
  }
  return s + AllTables(app, fn, true) + body;
}

}  // namespace shardline::ctl
