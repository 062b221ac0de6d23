#!/usr/bin/env bash
# docs_commands_test.sh: every `remat` command the docs show runs, and prints what the
# docs say it prints.
#
#   docs_commands_test.sh REMAT_BINARY DISTRIBUTED(0|1) FILE.md...
#
# CTest runs it on docs/cli.md and README.md with the built tool (tests/CMakeLists.txt).
# Bash and coreutils only: no Python on the CI machines.
#
# The convention in the markdown
# ------------------------------
# - A command is a line `$ remat ...` inside a fenced code block. The lines after it, up
#   to the next `$ ` line or the end of the block, are its documented output.
# - `$ echo $?` followed by a number states the exit code of the command before it;
#   a command without one must exit 0.
# - A line `...` in an output stands for omitted lines and is not checked.
# - Any other `$ ` line is an error here: shell set-up lines (`make demo`, `cmake ...`)
#   are written without `$ `, and such blocks are not run.
# - The commands of one file run in order, as a reader would type them, through
#   `bash -c` in one scratch directory: pipes and redirections work, and a file one
#   command writes (`remat profile --out gpt_chain.json`) is there for the next.
#
# How output is checked: every documented output line must appear among the lines
# the command printed (stdout and stderr together; order and extra lines do not
# matter), after both sides are normalised by `normalise` below: op names (R0, C1,
# B4) and numbers are masked, a number with its unit (13.3 MiB, 412 ms, 0.32x, 50%,
# "1 min 07 s") is one mask, adjacent masks merge, and runs of blanks are one blank.
# So words, column names and the shape of a line are checked; values, column widths
# and the exact plan chosen on a given machine are not.
#
# The three lists below are the only exceptions. Each entry says why it is there; to
# check more, delete an entry (and re-record the output in the docs from the tool).

set -u

# Commands inherently too long for a test: flags added to (or, when the command
# already has the flag, replacing its value in) every command matching the pattern.
# Pairs: command pattern (extended regex on the command as documented), flags.
SHRINK=(
  # `remat train` trains 250 steps by default (the demo takes 1-2 min).
  '^remat train( |$)' '--steps 6'
  # The full sweep times 2 + 10 rounds; 6 timed rounds still give every ratio its interval.
  '^remat bench( |$)' '--warmup 0 --repeats 6'
  # The time-limited fit times 10 steps per candidate batch of thousands (about 90 s).
  '^remat fit .*--max-time-ratio' '--max-batch 256'
)

# Documented output lines that are not checked. Pairs: command pattern, line pattern
# (extended regexes; the line pattern is matched against the documented line).
UNCHECKED=(
  # Progress lines: how many there are and their times depend on --steps and the load.
  '^remat train( |$)' '^step [0-9]+/[0-9]+ '
  # The time ratio: its interval needs 6 steps after the warm-up (the demos' 20, not 6),
  # and whether it excludes 1 depends on the load (cli_test checks the line's forms).
  '^remat train( |$)' '^ +ratio '
  # Whether self-correction keeps the plan or re-plans depends on the measured times.
  '^remat train( |$)' '^ +(the plan: |plan +self-correcting)'
  '^remat train( |$)' '^re-plan |^ +(from|to) '
  # Which strategies meet a time limit, and at which batch, depends on measured times.
  '^remat fit .*--max-time-ratio' '^ *(none|checkpoint_sequential|optimal)'
)

# Commands not run here, with the reason; matched against the command as documented.
NOT_RUN=()
if [[ ${2:-} != 1 ]]; then
  # Data parallel and sharded runs need remat::distributed (Gloo), not built here.
  NOT_RUN+=('--nproc|--shard|--rank' 'built without remat::distributed (REMAT_BUILD_DISTRIBUTED=OFF)')
fi
if ! command -v gnuplot >/dev/null 2>&1; then
  # Without gnuplot the plot is not drawn and the report says so instead.
  UNCHECKED+=('.' '^(plot|report) ')
fi

# Fixtures: files a documented command names as the reader's own, made in the
# scratch directory before the commands run.
make_fixtures() { # $1: scratch directory, $2: any text file
  cp "$2" "$1/mybook.txt" # `remat train --data mybook.txt`: any text file
}

# A line with op names, numbers and units masked, blanks collapsed (see above).
normalise() {
  sed -E \
    -e 's/\b[A-Z][0-9]+\b/#/g' \
    -e 's/[0-9]+(\.[0-9]+)?/#/g' \
    -e 's/# ?((B|KB|MB|GB|TB|KiB|MiB|GiB|TiB|ms|s|min|x)\b|%)/#/g' \
    -e 's/#( +#)+/#/g' \
    -e 's/[[:space:]]+/ /g' -e 's/^ //' -e 's/ $//'
}

# The command with the SHRINK flags for it: a flag it has gets the new value in place,
# a flag it lacks goes right after `remat SUBCOMMAND` (before any pipe or redirection).
shrink() {
  local command=$1 i
  for ((i = 0; i < ${#SHRINK[@]}; i += 2)); do
    [[ $1 =~ ${SHRINK[i]} ]] || continue
    local -a flags
    read -r -a flags <<<"${SHRINK[i + 1]}"
    local j
    for ((j = 0; j < ${#flags[@]}; j += 2)); do
      local flag=${flags[j]} value=${flags[j + 1]}
      if [[ $command =~ (^| )${flag}[=\ ][^\ ]+ ]]; then
        command=${command/"${BASH_REMATCH[0]}"/"${BASH_REMATCH[1]}$flag $value"}
      else
        command=$(sed -E "s/^(remat [a-z-]+)/\\1 $flag $value/" <<<"$command")
      fi
    done
  done
  printf '%s\n' "$command"
}

# Is documented line $2 of command $1 unchecked?
unchecked() {
  local i
  [[ $2 == ... ]] && return 0
  for ((i = 0; i < ${#UNCHECKED[@]}; i += 2)); do
    if [[ $1 =~ ${UNCHECKED[i]} && $2 =~ ${UNCHECKED[i + 1]} ]]; then return 0; fi
  done
  return 1
}

# The reason command $1 is not run, or nothing.
not_run_reason() {
  local i
  for ((i = 0; i < ${#NOT_RUN[@]}; i += 2)); do
    if [[ $1 =~ ${NOT_RUN[i]} ]]; then printf '%s' "${NOT_RUN[i + 1]}"; fi
  done
}

if (($# < 3)); then
  echo "usage: $0 REMAT_BINARY DISTRIBUTED(0|1) FILE.md..." >&2
  exit 64
fi
remat_binary=$(realpath "$1")
shift 2
[[ -x $remat_binary ]] || {
  echo "docs_commands_test: no executable at $remat_binary" >&2
  exit 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/remat-docs-test.XXXXXX")
mkdir "$work/bin"
ln -s "$remat_binary" "$work/bin/remat"
failures=0
ran=0
started=$SECONDS

# Parses one markdown file into parallel arrays (one entry per command).
parse() { # $1: file
  cmd_line=() cmd_text=() cmd_exit=() cmd_expect=()
  local in_fence=0 n=0 current=-1 awaiting_exit=-1 text
  while IFS= read -r text || [[ -n $text ]]; do
    n=$((n + 1))
    if [[ $text =~ ^[[:space:]]*\`\`\` ]]; then
      in_fence=$((1 - in_fence))
      current=-1 awaiting_exit=-1
      continue
    fi
    ((in_fence)) || continue
    if [[ $text == '$ echo $?' ]]; then
      if ((current < 0)); then
        echo "FAIL $1:$n: \`\$ echo \$?\` without a command before it"
        failures=$((failures + 1))
      fi
      awaiting_exit=$current current=-1
    elif [[ $text == '$ '* ]]; then
      awaiting_exit=-1
      if [[ $text != '$ remat '* && $text != '$ remat' ]]; then
        echo "FAIL $1:$n: \`$text\`: only \`\$ remat ...\` and \`\$ echo \$?\` lines are commands here"
        failures=$((failures + 1))
        current=-1
        continue
      fi
      current=${#cmd_text[@]}
      cmd_line+=("$n") cmd_text+=("${text#\$ }") cmd_exit+=(0) cmd_expect+=("")
    elif ((awaiting_exit >= 0)); then
      cmd_exit[awaiting_exit]=$text
      awaiting_exit=-1
    elif ((current >= 0)); then
      cmd_expect[current]+="$text"$'\n'
    fi
  done <"$1"
}

for markdown in "$@"; do
  parse "$markdown"
  name=$(basename "$markdown")
  scratch="$work/$name"
  mkdir -p "$scratch"
  make_fixtures "$scratch" "$markdown"
  for ((k = 0; k < ${#cmd_text[@]}; k++)); do
    documented=${cmd_text[k]}
    where="$markdown:${cmd_line[k]}"
    reason=$(not_run_reason "$documented")
    if [[ -n $reason ]]; then
      echo "SKIP $where: $documented ($reason)"
      continue
    fi
    command=$(shrink "$documented")
    out="$work/out.txt"
    began=$SECONDS
    (cd "$scratch" && PATH="$work/bin:$PATH" timeout 300 bash -c "$command") >"$out" 2>&1
    status=$?
    ran=$((ran + 1))
    normalise <"$out" >"$work/out.norm"
    missing=""
    while IFS= read -r expected; do
      [[ -z ${expected//[[:space:]]/} ]] && continue
      unchecked "$documented" "$expected" && continue
      if ! grep -Fxq -- "$(normalise <<<"$expected")" "$work/out.norm"; then
        missing+="    $expected"$'\n'
      fi
    done <<<"${cmd_expect[k]}"
    if [[ $status != "${cmd_exit[k]}" || -n $missing ]]; then
      failures=$((failures + 1))
      echo "FAIL $where: \`$command\`"
      echo "  exit code $status (documented: ${cmd_exit[k]})"
      if [[ -n $missing ]]; then
        echo "  documented lines missing from its output:"
        printf '%s' "$missing"
      fi
      echo "  its output (last 40 lines):"
      tail -n 40 "$out" | sed 's/^/    | /'
    else
      echo "ok   $where: \`$command\` ($((SECONDS - began)) s)"
    fi
  done
done

echo "$ran commands in $((SECONDS - started)) s, $failures failed"
if ((failures > 0)); then
  echo "scratch directory kept: $work"
  exit 1
fi
rm -rf "$work"
