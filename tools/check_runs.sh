#!/usr/bin/env bash
# docs/runs keeps only the runs something cites, each described in docs/runs/MANIFEST.md.
# Fails, naming the files, when
#   - a file of docs/runs is cited nowhere: its name appears in no file of the repository outside
#     docs/runs (README.md, docs/*.md, code comments, scripts; tracked and untracked files that
#     git does not ignore, so target/ and other build outputs are not searched);
#   - a file has no row in MANIFEST.md, or a row names a file that does not exist;
#   - a row lacks the commit that added the file, the machine or the command that produced it
#     (a `quoted` command, e.g. `edgellm-allreduce-bench --mode real --graph-ops 20` or
#     `tools/gpu/contract_check.sh`; "see the file's first lines" is not one).
# No GPU, no build: run it from anywhere in the repository (.ci/run does, before tools/test.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
runs=docs/runs
manifest=$runs/MANIFEST.md
fail=0
problem() { echo "check_runs: $*" >&2; fail=1; }
trim() { local v=$1; v=${v#"${v%%[![:space:]]*}"}; printf '%s' "${v%"${v##*[![:space:]]}"}"; }

[ -f "$manifest" ] || { echo "check_runs: $manifest is missing" >&2; exit 1; }
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "check_runs: needs a git work tree (git grep)" >&2; exit 2; }

mapfile -t files < <(find "$runs" -maxdepth 1 -type f ! -name MANIFEST.md -printf '%f\n' | LC_ALL=C sort)
[ ${#files[@]} -gt 0 ] || { echo "check_runs: $runs holds no runs" >&2; exit 1; }
# Subfolders would escape both checks.
if find "$runs" -mindepth 1 -type d | grep -q .; then problem "$runs holds folders; keep runs as plain files"; fi

# 1. Cited somewhere outside docs/runs.
for f in "${files[@]}"; do
  if ! git grep --untracked -q -F -e "$f" -- . ":(exclude)$runs" 2>/dev/null; then
    problem "uncited: $runs/$f (no file outside $runs names it; cite it or git rm it)"
  fi
done

# 2. MANIFEST rows: | `file` | added in | machine | produced by |
declare -A row_of=()
shallow=$(git rev-parse --is-shallow-repository 2>/dev/null || echo false)
while IFS= read -r line; do
  [[ $line =~ ^\|\ *\`([^\`]+)\`\ *\| ]] || continue
  name=${BASH_REMATCH[1]}
  IFS='|' read -r _ _ added machine command _ <<<"$line"
  added=$(trim "$added"); machine=$(trim "$machine"); command=$(trim "$command")
  [ -z "${row_of[$name]:-}" ] || problem "MANIFEST names $name twice"
  row_of[$name]=1
  [ -f "$runs/$name" ] || problem "MANIFEST names $name, which is not in $runs"
  if [[ $added =~ ^([0-9a-f]{7,40})([^0-9a-f]|$) ]]; then
    commit=${BASH_REMATCH[1]}
    if [ "$shallow" = false ] && ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
      problem "MANIFEST row of $name: $commit is no commit of this repository"
    fi
  else
    problem "MANIFEST row of $name: no commit in 'added in' ($added)"
  fi
  [ -n "$machine" ] && [ "$machine" != "-" ] || problem "MANIFEST row of $name: no machine"
  # A command: a `quoted` span whose first word is a program or a path (not an option, not a
  # file extension), and no "see the file" in place of one.
  has_command=0
  rest=$command
  while [[ $rest =~ \`([^\`]+)\`(.*) ]]; do
    first=${BASH_REMATCH[1]%% *}
    rest=${BASH_REMATCH[2]}
    if [[ $first =~ ^(\.?/?[A-Za-z0-9_.+-]+/)*[A-Za-z][A-Za-z0-9_.+-]*$ ]]; then has_command=1; break; fi
  done
  if [ $has_command = 0 ] || [[ ${command,,} == *"see the file"* ]]; then
    problem "MANIFEST row of $name: 'produced by' names no command ($command)"
  fi
done <"$manifest"
for f in "${files[@]}"; do
  [ -n "${row_of[$f]:-}" ] || problem "$runs/$f has no row in $manifest"
done

if [ $fail = 0 ]; then
  echo "check_runs: ${#files[@]} runs, each cited and in $manifest"
fi
exit $fail
