#!/bin/bash
# Hydra's ssh launcher, on this machine: drop ssh's options and the host name, run the
# proxy command locally (tests/test_hosts.py). MPI then sees one node per host name.
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i|-F) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
shift  # the host name
exec bash -c "$*"
