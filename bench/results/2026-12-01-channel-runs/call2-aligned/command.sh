# call2 ran call1-column-walk/command.sh unchanged (its paths: call2 for call1), with the
# aligned-grid build (d47281a) in gpu-bundle/bin and c7fc0fa in gpu-bundle/old.
bash gpu-bundle/call1.sh
