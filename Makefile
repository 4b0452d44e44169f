# fieldgate build, test and release targets.
#
# `make test` is the one command that checks everything; CI runs exactly it.
# It installs the tools it needs when they are missing.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

GO      ?= go
GOBIN   := $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo 0.0.0-dev)
COMMIT  ?= $(shell git rev-parse --verify -q --short HEAD 2>/dev/null || echo dev)
STAMP   := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

# Release binaries: no cgo, so they are static and run on any Pi OS or
# Debian image; no symbols or paths, to keep them small and reproducible.
RELEASE := CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(STAMP)"

STATICCHECK_VERSION := v0.8.2
FUZZTIME ?= 30s
# Every decoder's fuzz target, as PACKAGE:TARGET. make test runs each for
# TEST_FUZZTIME, make soak for SOAK_FUZZTIME.
FUZZ_TARGETS := \
	./matcher:FuzzIndex ./matcher:FuzzValidate ./matcher:FuzzSubscribeOptions ./matcher:FuzzAlgebra \
	./internal/mqttwire:FuzzReadPacket \
	./gateway/broker:FuzzConnReader ./gateway/broker:FuzzStoredMessage ./gateway/broker:FuzzRestore \
	./gateway/broker/auth:FuzzPasswordFile ./gateway/broker/auth:FuzzACL \
	./gateway/bridge/mqttclient:FuzzClientStream ./gateway/bridge:FuzzTemplate \
	./gateway/config:FuzzParse ./gateway/ops:FuzzRequest \
	./storage:FuzzDecode ./storage:FuzzStateFile \
	./sensors:FuzzW1Slave ./sensors:FuzzCommand ./sensors:FuzzSHTWords ./sensors:FuzzI2CDevices \
	./cmd/fieldgate:FuzzReadPassword
TEST_FUZZTIME ?= 5s
SOAK_FUZZTIME ?= 20s
# Kill cycles of `make soak`; make test runs the reliability suite's short
# lengths, and make soak the full ones (FIELDGATE_SOAK=1).
SOAK_KILLS ?= 100
# Where the reliability suite leaves its records (internal/relrecord).
REL_OUT ?= $(CURDIR)/bin/reliability

.PHONY: build cross run lint test test-unit test-fuzz test-bench-module \
	bench bench-matcher fuzz fuzz-broker soak qemu-check qemu-sensors tools staticcheck system-packages testtools clean help

## help: this list
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## build: bin/fieldgate for this machine
build:
	$(GO) build -ldflags "$(STAMP)" -o bin/fieldgate ./cmd/fieldgate

## cross: static release binaries for the boards fieldgate runs on
# ARMv6 (Pi Zero, Pi 1) needs GOARM=6: a GOARM=7 binary uses instructions
# those cores lack and dies at start. ARMv7 covers 32-bit OS images on Pi 2-5.
cross:
	GOOS=linux GOARCH=arm GOARM=6 $(RELEASE) -o bin/fieldgate-linux-armv6 ./cmd/fieldgate
	GOOS=linux GOARCH=arm GOARM=7 $(RELEASE) -o bin/fieldgate-linux-armv7 ./cmd/fieldgate
	GOOS=linux GOARCH=arm64 $(RELEASE) -o bin/fieldgate-linux-arm64 ./cmd/fieldgate

## run: the gateway on the embedded configuration
run:
	$(GO) run ./cmd/fieldgate run

## lint: formatting, a tidy go.mod, go vet and staticcheck
# All run even when one fails, so one run lists every finding. The test
# tools' module (scripts/testtools) gets its own tidy check and vet.
lint: staticcheck
	@status=0; \
	unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt: these files need formatting:"; echo "$$unformatted"; status=1; fi; \
	echo "go mod tidy -diff"; $(GO) mod tidy -diff || status=1; \
	echo "go vet ./..."; $(GO) vet ./... || status=1; \
	echo "staticcheck ./..."; staticcheck ./... || status=1; \
	echo "scripts/testtools: go mod tidy -diff, go vet ./..."; ( cd scripts/testtools && $(GO) mod tidy -diff && $(GO) vet ./... ) || status=1; \
	exit $$status

## test: every check, in one run, with a summary at the end
# Each step runs even when an earlier one failed, so one run shows every
# failure; the tools step is the exception, since the rest depends on it.
TEST_STEPS := lint test-unit test-reliability test-fuzz test-bench-module cross qemu-check qemu-sensors systemd-check deb-check

test: tools
	@passed=0; failed=0; summary=""; \
	for step in $(TEST_STEPS); do \
		echo; echo "==> $$step"; \
		start=$$(date +%s); \
		if $(MAKE) --no-print-directory $$step; then result=PASS; passed=$$((passed + 1)); \
		else result=FAIL; failed=$$((failed + 1)); fi; \
		summary+="$$(printf '  %-4s  %-18s %4ss' "$$result" "$$step" "$$(( $$(date +%s) - start ))")"$$'\n'; \
	done; \
	echo; echo "== make test summary =="; printf '%s' "$$summary"; \
	echo "steps: $$passed passed, $$failed failed"; \
	[ "$$failed" -eq 0 ]

# Every package but the reliability suite, which has its own step. The
# -timeout is go test's guard against a hung package, not a deadline any
# test relies on: its default, 10 minutes per package, ended the broker's
# package at 601 s under the race detector on a 2-core machine at load 30,
# where it takes about 200 s at load 8; 30 minutes still stops a hang.
test-unit:
	$(GO) test -race -count=1 -timeout 30m $$($(GO) list ./... | grep -v '/gateway/reliability$$')

# The reliability suite at its short lengths (gateway/reliability), and a
# summary of what it measured.
# The slow-consumer case measures latency, so its test client runs without
# the race detector's slowdown; every other case runs with it.
REL_SUITES := crash,bridge-outage,bridge-nats,slow-consumer,connection-storm,malformed,hostile,bad-config
test-reliability: testtools
	@rm -rf $(REL_OUT)/short; rc=0; out=$(REL_OUT)/short; \
	FIELDGATE_RELIABILITY_OUT=$$out $(GO) test -race -count=1 -timeout 20m -skip '^TestSlowConsumer$$' ./gateway/reliability || rc=$$?; \
	[ $$rc -eq 0 ] || $(GO) run ./scripts/relreport fail -dir $$out -case "go test -race ./gateway/reliability" -detail "exit status $$rc; see its output above"; \
	rc2=0; FIELDGATE_RELIABILITY_OUT=$$out $(GO) test -count=1 -timeout 10m -run '^TestSlowConsumer$$' ./gateway/reliability || rc2=$$?; \
	[ $$rc2 -eq 0 ] || $(GO) run ./scripts/relreport fail -dir $$out -case "go test -run TestSlowConsumer ./gateway/reliability" -detail "exit status $$rc2; see its output above"; \
	$(GO) run ./scripts/relreport write -dir $$out -out - -summary -require $(REL_SUITES) -command "make test" || rc=1; \
	[ $$rc -eq 0 ] && [ $$rc2 -eq 0 ]

# Bounded runs of every decoder's fuzz target (FUZZ_TARGETS).
test-fuzz:
	@$(MAKE) --no-print-directory fuzz-all FUZZTIME=$(TEST_FUZZTIME) FUZZ_OUT=$(REL_OUT)/fuzz-short

# fuzz-all: each of FUZZ_TARGETS for FUZZTIME; with FUZZ_OUT, a record of
# each run for the reliability report. Go 1.26's fuzz coordinator can end
# a run that found nothing with "context deadline exceeded" when the time
# is up (go.dev/issue/75804, fixed in Go 1.27): it reads the deadline on
# the parent context before the cancel has reached the child, a window
# that a preempted thread widens, so on a loaded machine it comes back
# more often. A run that ends so, with no failing input and no panic, is
# run again, up to FUZZ_RERUNS times, and its record says how often. More
# workers (-parallel) or a longer -fuzzminimizetime would not help: the
# race is in the coordinator's own stop, not in the workers.
FUZZ_OUT ?=
FUZZ_RERUNS ?= 3
.PHONY: fuzz-all test-reliability
fuzz-all:
	@failed=0; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; log=$$(mktemp); reruns=0; \
		while :; do \
			echo "== $$pkg $$name for $(FUZZTIME)"; rc=0; \
			$(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=2s $$pkg >$$log 2>&1 || rc=$$?; \
			tail -3 $$log; \
			if [ $$rc -ne 0 ] && [ $$reruns -lt $(FUZZ_RERUNS) ] && grep -qx '    context deadline exceeded' $$log \
				&& ! grep -q -e 'Failing input written' -e 'panic:' $$log; then \
				echo "fuzz-all: $$name ended on the Go fuzz coordinator's deadline race (go.dev/issue/75804) with no failing input; running it again"; \
				reruns=$$((reruns + 1)); continue; \
			fi; \
			break; \
		done; \
		if [ -n "$(FUZZ_OUT)" ]; then $(GO) run ./scripts/relreport fuzz -dir "$(FUZZ_OUT)" -target "$${pkg#./} $$name" -log $$log -rc $$rc -reruns $$reruns; fi; \
		if [ $$rc -ne 0 ]; then failed=$$((failed + 1)); cat $$log; fi; \
		rm -f $$log; \
	done; \
	[ $$failed -eq 0 ] || { echo "fuzz-all: $$failed target(s) failed" >&2; exit 1; }

# scripts/bench is its own module; its tests check that the benchmarked
# implementations agree before their speed is compared.
test-bench-module:
	cd scripts/bench && $(GO) vet ./... && $(GO) test -count=1 -run . ./...

## bench: every side-by-side comparison in one go, then docs/BENCHMARKS.md and docs/bench/*.svg (scripts/bench/bench-all.sh, about 51 min on 2 cores; QUICK=1: a smoke run of 7 min)
# The main module's own benchmarks are not part of it: they take minutes,
# compare nothing and feed no table of the report; make bench-unit runs them.
bench:
	cd scripts/bench && ./bench-all.sh

## bench-unit: the main module's own go benchmarks
.PHONY: bench-unit
bench-unit:
	$(GO) test -run='^$$' -bench=. -benchmem ./...

## bench-matcher: the matcher against other implementations (scripts/bench)
bench-matcher:
	cd scripts/bench && ./bench-matcher.sh

## bench-broker: the broker against mochi-mqtt and Mosquitto over TCP (scripts/bench; QUICK=1: a smoke run)
.PHONY: bench-broker
bench-broker:
	cd scripts/bench && ./bench-broker.sh

## bench-storage: persisted QoS 1 publishing against mochi-mqtt + bolt and Mosquitto (scripts/bench; QUICK=1: a smoke run)
.PHONY: bench-storage
bench-storage:
	cd scripts/bench && ./bench-storage.sh

## bench-bridge: the bridge against Mosquitto's through an outage of the upstream (scripts/bench; QUICK=1: a smoke run)
.PHONY: bench-bridge
bench-bridge:
	cd scripts/bench && ./bench-bridge.sh

## bench-footprint: release binary sizes, broker heap per connection and subscription (386 and amd64), RSS of the ARM binaries under qemu-user-static (scripts/bench; QUICK=1: a smoke run)
.PHONY: bench-footprint
bench-footprint:
	cd scripts/bench && ./bench-footprint.sh

## bench-idle: CPU time of gateways at rest (embedded default and 50 simulated sensors, with and without a bridge) over 5 minutes (scripts/bench; QUICK=1: 30 s)
.PHONY: bench-idle
bench-idle:
	cd scripts/bench && ./bench-idle.sh

## fuzz: the matcher fuzz target for FUZZTIME (default 30s)
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzIndex -fuzztime=$(FUZZTIME) ./matcher

## fuzz-broker: raw bytes into the broker's connection reader for FUZZTIME
fuzz-broker:
	$(GO) test -run='^$$' -fuzz=FuzzConnReader -fuzztime=$(FUZZTIME) ./gateway/broker

## soak: the reliability suite at full length, every fuzz target for SOAK_FUZZTIME, then docs/RELIABILITY.md
soak: system-packages testtools
	@rm -rf $(REL_OUT)/soak; mkdir -p $(REL_OUT); rc=0; start=$$(date +%s); \
	FIELDGATE_SOAK=1 FIELDGATE_CRASH_KILLS=$(SOAK_KILLS) FIELDGATE_RELIABILITY_OUT=$(REL_OUT)/soak \
		$(GO) test -count=1 -timeout 120m -v ./gateway/reliability 2>&1 | tee $(REL_OUT)/soak-test.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok)' \
		|| { rc=1; FIELDGATE_SOAK=1 $(GO) run ./scripts/relreport fail -dir $(REL_OUT)/soak -case "go test ./gateway/reliability" -detail "it failed; its log is bin/reliability/soak-test.log"; }; \
	FIELDGATE_SOAK=1 $(MAKE) --no-print-directory fuzz-all FUZZTIME=$(SOAK_FUZZTIME) FUZZ_OUT=$(REL_OUT)/soak || rc=1; \
	$(GO) run ./scripts/relreport write -dir $(REL_OUT)/soak -out docs/RELIABILITY.md -command "make soak" || rc=1; \
	echo "soak: $$(( $$(date +%s) - start ))s; docs/RELIABILITY.md written"; \
	exit $$rc

## qemu-check: run the release binaries under user-mode emulation
# qemu-*-static runs a foreign binary without a sysroot, which also proves the
# binaries are static. -cpu arm1176 is the Pi Zero / Pi 1 core; the armv7
# binary must fail on it, or the emulated cpu is not the one we think.
qemu-check: cross system-packages
	@set -e; \
	check() { \
		local want="$$1"; shift; \
		echo "+ $$*"; \
		out="$$("$$@" version)"; echo "$$out"; \
		grep -q "$$want" <<<"$$out" || { echo "qemu-check: version output lacks '$$want'"; exit 1; }; \
		"$$@" check; \
	}; \
	check 'linux/arm GOARM=6' qemu-arm-static -cpu arm1176 bin/fieldgate-linux-armv6; \
	check 'linux/arm GOARM=7' qemu-arm-static bin/fieldgate-linux-armv7; \
	check 'linux/arm64' qemu-aarch64-static bin/fieldgate-linux-arm64; \
	rc=$$( { ulimit -c 0; qemu-arm-static -cpu arm1176 bin/fieldgate-linux-armv7 version >/dev/null 2>&1 && echo 0 || echo $$?; } 2>/dev/null ); \
	if [ "$$rc" -eq 0 ]; then \
		echo "qemu-check: the armv7 binary ran on an ARMv6 cpu, so the armv6 check proves nothing"; exit 1; \
	fi; \
	echo "qemu-check: armv6, armv7 and arm64 binaries run; armv7 rightly fails on an ARMv6 cpu"

## qemu-sensors: the sensor drivers' tests and the simulated bus, built for arm64 and run under emulation
# Register decoding, CRCs and scaling run on the architecture they ship for.
qemu-sensors: system-packages
	@set -e; mkdir -p bin; \
	for pkg in sensors sensors/sim; do \
		out=bin/$$(echo $$pkg | tr / -).arm64.test; \
		GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) test -c -o $$out ./$$pkg; \
		echo "+ qemu-aarch64-static $$out"; \
		( cd $$pkg && qemu-aarch64-static $(CURDIR)/$$out -test.count=1 ); \
	done

## systemd-check: systemd-analyze verify on the units in systemd/, the sysusers file, and the service's security exposure
# Works without a running systemd (in a container, in CI): see systemd/check.sh.
.PHONY: systemd-check
systemd-check: build
	bash systemd/check.sh bin/fieldgate

## deb: bin/fieldgate_DEB_VERSION_{arm64,armhf,amd64}.deb, built with dpkg-deb (packaging/README.md)
# The binaries are make cross's, plus one for amd64 built alike; armhf
# carries the ARMv6 build, which runs on every 32-bit Pi. DEB_VERSION
# comes from git describe (packaging/version.sh says how), once per run of
# make, so that deb and deb-check agree on the file names.
ifeq ($(origin DEB_VERSION),undefined)
DEB_VERSION := $(shell bash packaging/version.sh 2>/dev/null)
endif
.PHONY: deb deb-check
deb: cross
	GOOS=linux GOARCH=amd64 $(RELEASE) -o bin/fieldgate-linux-amd64 ./cmd/fieldgate
	DEB_VERSION='$(DEB_VERSION)' bash packaging/build-deb.sh bin \
		arm64=bin/fieldgate-linux-arm64 armhf=bin/fieldgate-linux-armv6 amd64=bin/fieldgate-linux-amd64

## deb-check: make deb, then check each package: contents, binary, maintainer scripts, lintian (packaging/check-deb.sh)
deb-check: deb system-packages
	bash packaging/check-deb.sh $(foreach arch,arm64 armhf amd64,bin/fieldgate_$(DEB_VERSION)_$(arch).deb)

## tools: install staticcheck, qemu-user-static, gcc (for -race), mosquitto (the bridge tests' upstream) and its clients, and chromium (the status page test) when missing; build the NATS server and its stream reader (testtools)
tools: staticcheck system-packages testtools

staticcheck:
	@command -v staticcheck >/dev/null || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

## testtools: bin/testtools/nats-server (NATS v2.15.3, the clustered upstream of the bridge-nats cases) and natsstream (their reader of its stream), from scripts/testtools
# Their own module keeps NATS out of the firmware's go.mod, as
# scripts/bench keeps its peers out. Rebuilt only when the module's
# go.mod, go.sum or sources are newer than the binaries: linking the
# server takes a while. internal/testkit/natscluster builds them alike
# when a test runs without make.
TESTTOOLS := bin/testtools/nats-server bin/testtools/natsstream
testtools: $(TESTTOOLS)
$(TESTTOOLS) &: scripts/testtools/go.mod scripts/testtools/go.sum $(wildcard scripts/testtools/*/*.go)
	@mkdir -p bin/testtools
	cd scripts/testtools && $(GO) build -o $(CURDIR)/bin/testtools/ github.com/nats-io/nats-server/v2 ./natsstream
	@touch $(TESTTOOLS)

# Debian packages the checks need: the race detector is built with cgo, so
# it needs a C compiler; qemu-check needs user-mode QEMU; the broker's
# interoperability tests drive mosquitto_pub and mosquitto_sub; the ops
# status page is tested in headless chromium. deb-check runs lintian,
# file and shellcheck, and systemd-sysusers for the maintainer scripts.
system-packages:
	@missing=""; \
	command -v qemu-arm-static >/dev/null && command -v qemu-aarch64-static >/dev/null || missing+=" qemu-user-static"; \
	command -v mosquitto_pub >/dev/null && command -v mosquitto_sub >/dev/null || missing+=" mosquitto-clients"; \
	{ command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ]; } || missing+=" mosquitto"; \
	command -v gcc >/dev/null || missing+=" gcc libc6-dev"; \
	command -v chromium >/dev/null || missing+=" chromium"; \
	for need in lintian:lintian file:file shellcheck:shellcheck systemd-sysusers:systemd; do command -v $${need%%:*} >/dev/null || missing+=" $${need#*:}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" -ne 0 ]; then \
		echo "missing Debian packages:$$missing; run: sudo apt-get update && sudo apt-get install -y$$missing" >&2; \
		exit 1; \
	fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get install -y $$missing || { apt-get update && apt-get install -y $$missing; }; \
	case "$$missing" in *" mosquitto "*|*" mosquitto") \
		if [ -d /run/systemd/system ]; then \
			echo "the tests run their own mosquitto; stopping the service the package started, to keep port 1883 free for fieldgate"; \
			systemctl disable --now mosquitto.service || true; \
		fi;; \
	esac

## image: bin/fieldgate-VERSION-arm64.img.xz, the SD-card image for 64-bit Raspberry Pis (image/README.md; as root)
# fieldgate goes in as make deb's arm64 package. With IMAGE_DEB= (empty)
# it is a stand-in instead: an arm64 binary built here, installed by hand
# with the units from systemd/ (image/customize.sh).
IMAGE := bin/fieldgate-$(VERSION)-arm64.img.xz
IMAGE_DEB ?= bin/fieldgate_$(DEB_VERSION)_arm64.deb
.PHONY: image image-test image-packages
image: image-packages $(if $(IMAGE_DEB),deb)
	@mkdir -p bin; \
	if [ -n "$(IMAGE_DEB)" ]; then \
		echo "image: installing $(IMAGE_DEB)"; export FIELDGATE_DEB="$(IMAGE_DEB)"; \
	else \
		echo "image: no package (IMAGE_DEB is empty): a stand-in arm64 binary and the units from systemd/"; \
		GOOS=linux GOARCH=arm64 $(RELEASE) -o bin/fieldgate-image-arm64 ./cmd/fieldgate; \
		export FIELDGATE_BIN=bin/fieldgate-image-arm64; \
	fi; \
	start=$$(date +%s); \
	CACHE_DIR=.cache/image/apt image/build.sh $(IMAGE); \
	echo "image: built in $$(( $$(date +%s) - start ))s"

## image-test: boot the image under qemu-system-aarch64 -M virt and check it over ssh and MQTT (IMAGE_REUSE=1: test the image already built)
image-test: image-packages $(if $(IMAGE_REUSE),,image)
	@start=$$(date +%s); \
	image/test.sh $(IMAGE); \
	echo "image-test: booted and checked in $$(( $$(date +%s) - start ))s"

# What image and image-test need from Debian, and qemu-aarch64 registered
# with binfmt_misc so that arm64 maintainer scripts run during the build
# (image/README.md says why and how).
image-packages:
	@missing=""; \
	command -v mmdebstrap >/dev/null || missing+=" mmdebstrap"; \
	command -v arch-test >/dev/null || missing+=" arch-test"; \
	command -v qemu-aarch64-static >/dev/null || missing+=" qemu-user-static"; \
	command -v update-binfmts >/dev/null || missing+=" binfmt-support"; \
	command -v mkfs.vfat >/dev/null || missing+=" dosfstools"; \
	command -v mcopy >/dev/null || missing+=" mtools"; \
	command -v mkfs.ext4 >/dev/null || missing+=" e2fsprogs"; \
	command -v sfdisk >/dev/null || missing+=" fdisk"; \
	command -v xz >/dev/null || missing+=" xz-utils"; \
	command -v fdtget >/dev/null || missing+=" device-tree-compiler"; \
	command -v qemu-system-aarch64 >/dev/null || missing+=" qemu-system-arm"; \
	command -v ssh >/dev/null || missing+=" openssh-client"; \
	command -v ss >/dev/null || missing+=" iproute2"; \
	{ command -v mosquitto_sub >/dev/null && command -v mosquitto_pub >/dev/null; } || missing+=" mosquitto-clients"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" -ne 0 ]; then \
			echo "missing Debian packages:$$missing; run: sudo apt-get update && sudo apt-get install -y --no-install-recommends$$missing" >&2; \
			exit 1; \
		fi; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y --no-install-recommends $$missing || { apt-get update && apt-get install -y --no-install-recommends $$missing; }; \
	fi; \
	image/binfmt.sh

## clean: remove bin/
clean:
	rm -rf bin
