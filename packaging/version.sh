#!/usr/bin/env bash
# Prints the Debian version of the package built from this checkout, made
# from `git describe --tags --always --dirty --match 'v[0-9]*'` (D below) and
# the date of HEAD's commit in UTC (DATE, as YYYYMMDD):
#
#   D                    upstream part                      example
#   HASH (no tag yet)    0.0~gitDATE.HASH                   0.0~git20261129.5affee0
#   vX.Y.Z               X.Y.Z                              1.2.0
#   vX.Y.Z-N-gHASH       X.Y.Z+gitDATE.N.HASH               1.2.0+git20261203.4.1a2b3c4
#
# then "-" and the Debian revision, DEB_REVISION (default 1):
# 0.0~git20261129.5affee0-1. A "-" inside a tag becomes "~", so a
# pre-release sorts before its release (v1.2.0-rc1 gives 1.2.0~rc1). A tree
# with uncommitted changes adds "+dirty" to the upstream part, so such a
# build never passes for the commit's own.
#
# Why: "~" sorts before anything, so untagged snapshots come before the first
# release (0.0~...), and "+git" after the tag they follow; DATE and then N
# order snapshots along the history. Two untagged commits from one UTC day
# are ordered only by their hashes, that is arbitrarily: tag a release
# before shipping two builds of one day. Only tags of the form v<digit>...
# count, so another kind of tag can never make a malformed version. The
# revision is 1 because the packaging lives in this repository and changes
# only with a new commit; raise it for a rebuild of the same commit (with a
# newer Go toolchain, say).
#
# usage: packaging/version.sh     (from anywhere in the checkout)
set -euo pipefail

cd "$(dirname "$0")/.."
revision=${DEB_REVISION:-1}

if ! described=$(git describe --tags --always --dirty --match 'v[0-9]*' 2>/dev/null); then
	echo "version.sh: not a git checkout (git describe failed); set DEB_VERSION" >&2
	exit 1
fi
date=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d)

dirty=""
if [[ $described == *-dirty ]]; then
	described=${described%-dirty}
	dirty="+dirty"
fi

if [[ $described =~ ^v([0-9][A-Za-z0-9.~-]*)-([0-9]+)-g([0-9a-f]+)$ ]]; then
	upstream="${BASH_REMATCH[1]//-/\~}+git$date.${BASH_REMATCH[2]}.${BASH_REMATCH[3]}"
elif [[ $described =~ ^v([0-9][A-Za-z0-9.~-]*)$ ]]; then
	upstream="${BASH_REMATCH[1]//-/\~}"
elif [[ $described =~ ^[0-9a-f]+$ ]]; then
	upstream="0.0~git$date.$described"
else
	echo "version.sh: cannot make a Debian version of git describe's '$described'" >&2
	exit 1
fi

version="$upstream$dirty-$revision"
if ! dpkg --validate-version "$version" 2>/dev/null; then
	echo "version.sh: '$version' (from '$described') is not a valid Debian version" >&2
	exit 1
fi
echo "$version"
