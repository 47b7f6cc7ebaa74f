# call3a ran ../call3b-packed/command.sh unchanged, on the first build of the packed FP8 path
# (its byte tile lacked the 4-byte alignment; new_cuda_layers.txt and call3.txt show the failure).
exec bash "$(dirname "$0")/../call3b-packed/command.sh"
