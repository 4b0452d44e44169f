#!/usr/bin/env bash
# Writes the machine-readable copyright file (DEP-5) of the fieldgate
# package to standard output, for the binary it will carry:
#
#   - packaging/copyright.in: the header and fieldgate's own paragraph;
#   - one paragraph per licence text, for the Go runtime and standard library
#     and every module `go version -m BINARY` lists as linked in: the
#     versions, the copyright statements found in the licence file, the
#     NOTICE file and the first copyright line of each non-test .go file,
#     and the licence (packaging/licences names it; its text is the module's
#     own licence file, except Apache-2.0, which Debian keeps in
#     /usr/share/common-licenses), plus the module's NOTICE, which the
#     Apache licence asks to be passed on;
#   - the standalone Apache-2.0 paragraph, fieldgate's own licence.
#
# Nothing is guessed: a module packaging/licences does not list, or whose
# licence file no longer has the hash recorded there, stops the build.
# Module sources come from the module cache (go mod download fetches them
# when missing); the standard library's from the go in PATH, which must be
# the release that built BINARY.
#
# usage: packaging/copyright.sh BINARY > copyright
set -euo pipefail
export LC_ALL=C # the order of sort, the classes of grep and awk

bin=${1:?usage: $0 BINARY}
here=$(cd "$(dirname "$0")" && pwd)
table=$here/licences

fail() {
	echo "copyright.sh: $*" >&2
	exit 1
}

info=$(go version -m "$bin") || fail "go version -m $bin failed"
built_with=$(head -n 1 <<<"$info" | awk '{print $2}')
have=$(go env GOVERSION)
[ "$built_with" = "$have" ] ||
	fail "$bin was built with $built_with, the go in PATH is $have: the standard library's licence must come from the release that built it"

# module path and version of each linked module; a replacement (=>) takes
# the place of the module it replaces.
modules=$(awk -F'\t' '
	$2 == "dep" { if (path != "") print path, version; path = $3; version = $4 }
	$2 == "=>"  { path = $3; version = $4 }
	END         { if (path != "") print path, version }' <<<"$info")
[ -n "$modules" ] || fail "go version -m $bin lists no modules; is it a Go binary built in module mode?"

# licence_of MODULE prints the licence and hash packaging/licences records.
licence_of() {
	awk -F'|' -v m="$1" '
		/^#/ { next }
		{ for (i = 1; i <= NF; i++) gsub(/^[ \t]+|[ \t]+$/, "", $i) }
		$1 == m { print $2 "|" $3; found = 1; exit }
		END { exit !found }' "$table"
}

# licence_file DIR prints the one licence file in DIR.
licence_file() {
	local found=()
	for name in LICENSE LICENSE.md LICENSE.txt LICENCE COPYING; do
		[ -f "$1/$name" ] && found+=("$1/$name")
	done
	[ "${#found[@]}" -eq 1 ] || fail "$1: want one licence file, found ${#found[@]}"
	echo "${found[0]}"
}

# copyright_lines FILE... prints lines that state a copyright.
copyright_lines() {
	grep -hiE '^[[:space:]]*(//|#)?[[:space:]]*Copyright[[:space:]]+(\(c\)|©|[0-9])' "$@" || true
}

# source_copyright_lines DIR prints the first copyright line of each .go
# file that can be linked in (no tests, no test data).
source_copyright_lines() {
	find "$1" -name testdata -prune -o -name '*.go' ! -name '*_test.go' -print0 |
		xargs -0 -r grep -hsiE -m1 '^//[[:space:]]*Copyright[[:space:]]+(\(c\)|©|[0-9])' || true
}

# holders turns copyright lines into one "YEARS HOLDER" line per holder,
# years from the earliest to the latest seen, holders told apart
# regardless of case, spaces and punctuation.
holders() {
	awk '
		{
			s = $0
			sub(/^[ \t]*(\/\/|#)?[ \t]*[Cc][Oo][Pp][Yy][Rr][Ii][Gg][Hh][Tt][ \t]+/, "", s)
			sub(/^(\([cC]\)|©)[ \t]*/, "", s)
			years = ""
			while (match(s, /^[0-9][0-9][0-9][0-9]([ \t]*[-,][ \t]*|[ \t]+)?/)) {
				years = years " " substr(s, 1, 4)
				s = substr(s, RLENGTH + 1)
			}
			sub(/[ \t]*[Aa]ll [Rr]ights [Rr]eserved.*$/, "", s)
			sub(/[ \t.,]+$/, "", s)
			if (s == "" || years == "") next
			key = tolower(s)
			gsub(/[^a-z0-9]/, "", key)
			if (!(key in name)) { name[key] = s; lo[key] = 9999; hi[key] = 0 }
			n = split(years, y, " ")
			for (i = 1; i <= n; i++) {
				if (y[i] + 0 < lo[key]) lo[key] = y[i] + 0
				if (y[i] + 0 > hi[key]) hi[key] = y[i] + 0
			}
		}
		END {
			for (k in name) print (lo[k] == hi[k] ? lo[k] : lo[k] "-" hi[k]) " " name[k]
		}' | sort -t' ' -k2
}

# field_text prints stdin as the continuation lines of a field.
field_text() {
	sed -e 's/[[:space:]]*$//' -e 's/^$/./' -e 's/^/ /'
}

# Group the modules by licence text: one paragraph for modules that share
# one (the Go project's, the Periph authors').
declare -A group_modules group_licence group_file group_copyright group_notice
order=()
add() { # add MODULE VERSION DIR LICENCE_FILE SOURCE_DIR...
	local module=$1 version=$2 dir=$3 file=$4
	shift 4
	local entry licence sha
	entry=$(licence_of "$module") ||
		fail "packaging/licences has no line for $module ($version): read $file and add one"
	licence=${entry%%|*}
	sha=$(sha256sum <"$file" | cut -d' ' -f1)
	[ "$sha" = "${entry#*|}" ] ||
		fail "the licence file of $module $version ($file) is not the one read before (sha256 $sha): read it again and update packaging/licences"
	local key="$sha $licence"
	if [ -z "${group_modules[$key]+set}" ]; then
		order+=("$key")
		group_licence[$key]=$licence
		group_file[$key]=$file
	fi
	group_modules[$key]+="$module $version"$'\n'
	group_copyright[$key]+=$(
		copyright_lines "$file"
		[ -f "$dir/NOTICE" ] && copyright_lines "$dir/NOTICE"
		for src in "$@"; do source_copyright_lines "$src"; done
	)$'\n'
	if [ -f "$dir/NOTICE" ]; then
		group_notice[$key]+="NOTICE of $module:"$'\n'"$(cat "$dir/NOTICE")"$'\n'
	fi
}

goroot=$(go env GOROOT)
add std "$built_with" "$goroot" "$goroot/LICENSE" "$goroot/src"
while read -r module version; do
	[ -n "$version" ] || fail "$module is replaced by a directory; its licence cannot be read from the module cache"
	dir=$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
	[ -d "$dir" ] || fail "go mod download $module@$version gave no directory"
	add "$module" "$version" "$dir" "$(licence_file "$dir")" "$dir"
done <<<"$modules"

cat "$here/copyright.in"
# fieldgate's own paragraph (copyright.in) is Apache-2.0, so the licence's
# standalone paragraph is always there.
need_apache=true
for key in "${order[@]}"; do
	licence=${group_licence[$key]}
	echo
	echo "Files: $(awk '{ printf "%s%s/*", (NR > 1 ? " " : ""), $1 }' <<<"${group_modules[$key]%$'\n'}")"
	echo "Copyright: $(holders <<<"${group_copyright[$key]}" | sed '1!s/^/ /')"
	if [ "$licence" = Apache-2.0 ]; then
		echo "License: $licence"
		need_apache=true
	else
		echo "License: $licence"
		field_text <"${group_file[$key]}" | sed '1{/^ \.$/d}'
	fi
	echo "Comment: Linked: $(awk '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2 }' <<<"${group_modules[$key]%$'\n'}")."
	if [ -n "${group_notice[$key]:-}" ]; then
		echo " ."
		field_text <<<"${group_notice[$key]%$'\n'}"
	fi
done

if $need_apache; then
	echo
	echo "License: Apache-2.0"
	echo " On Debian systems the full text of the Apache License, Version 2.0 is"
	echo " in /usr/share/common-licenses/Apache-2.0."
fi
