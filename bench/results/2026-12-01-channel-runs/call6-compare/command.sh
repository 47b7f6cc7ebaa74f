set -u
cd gpu-bundle
PARTS="tests throughput speed profile" bash bench/compare_builds.sh old bin $OUT/cmp
