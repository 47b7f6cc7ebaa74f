cd gpu-bundle && PARTS="throughput" bash bench/compare_builds.sh old bin $OUT/tp
