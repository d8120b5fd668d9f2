set terminal pngcairo size 1800,480 font ',10'
set output '/work/main/bench/results/20261201T214117Z/plots/reduce.png'
set datafile separator ','
set datafile missing '?'
set logscale x 2
set logscale y 10
set format y '%g'
set grid
set xrange [16:67108864]
set xlabel 'size (bytes)'
set ylabel 'busbw (GB/s)'
set key below maxrows 3 font ',9'
set xtics ('8' 8, '64' 64, '512' 512, '4K' 4096, '32K' 32768, '256K' 262144, '2M' 2097152, '16M' 16777216, '128M' 134217728, '1G' 1073741824)
set multiplot layout 1,3 title 'reduce: busbw against size (median of repetitions)'
set title '2 ranks'
plot '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n2.csv' using 1:2 with linespoints lw 2 pt 1 ps 0.7 title 'hccl', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n2.csv' using 1:3 with linespoints lw 2 pt 2 ps 0.7 title 'hccl-tcp', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n2.csv' using 1:4 with linespoints lw 2 pt 3 ps 0.7 title 'ompi', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n2.csv' using 1:5 with linespoints lw 2 pt 4 ps 0.7 title 'ompi-tcp', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n2.csv' using 1:6 with linespoints lw 2 pt 5 ps 0.7 title 'mpich', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n2.csv' using 1:7 with linespoints lw 2 pt 6 ps 0.7 title 'mpich-tcp', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n2.csv' using 1:8 with linespoints lw 2 pt 7 ps 0.7 title 'gloo', '/work/main/bench/results/20261201T214117Z/plots/data/limits_n2.csv' using 1:2 with lines dt 2 lw 1.5 lc rgb 'black' title 'limit shm', '/work/main/bench/results/20261201T214117Z/plots/data/limits_n2.csv' using 1:3 with lines dt 3 lw 1.5 lc rgb 'gray40' title 'limit tcp'
set title '4 ranks'
plot '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n4.csv' using 1:2 with linespoints lw 2 pt 1 ps 0.7 title 'hccl', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n4.csv' using 1:3 with linespoints lw 2 pt 2 ps 0.7 title 'hccl-tcp', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n4.csv' using 1:4 with linespoints lw 2 pt 3 ps 0.7 title 'ompi', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n4.csv' using 1:5 with linespoints lw 2 pt 4 ps 0.7 title 'ompi-tcp', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n4.csv' using 1:6 with linespoints lw 2 pt 5 ps 0.7 title 'mpich', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n4.csv' using 1:7 with linespoints lw 2 pt 6 ps 0.7 title 'mpich-tcp', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n4.csv' using 1:8 with linespoints lw 2 pt 7 ps 0.7 title 'gloo', '/work/main/bench/results/20261201T214117Z/plots/data/limits_n4.csv' using 1:2 with lines dt 2 lw 1.5 lc rgb 'black' title 'limit shm', '/work/main/bench/results/20261201T214117Z/plots/data/limits_n4.csv' using 1:3 with lines dt 3 lw 1.5 lc rgb 'gray40' title 'limit tcp'
set title '8 ranks'
plot '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n8.csv' using 1:2 with linespoints lw 2 pt 1 ps 0.7 title 'hccl', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n8.csv' using 1:3 with linespoints lw 2 pt 2 ps 0.7 title 'hccl-tcp', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n8.csv' using 1:4 with linespoints lw 2 pt 3 ps 0.7 title 'ompi', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n8.csv' using 1:5 with linespoints lw 2 pt 4 ps 0.7 title 'ompi-tcp', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n8.csv' using 1:6 with linespoints lw 2 pt 5 ps 0.7 title 'mpich', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n8.csv' using 1:7 with linespoints lw 2 pt 6 ps 0.7 title 'mpich-tcp', '/work/main/bench/results/20261201T214117Z/plots/data/reduce_n8.csv' using 1:8 with linespoints lw 2 pt 7 ps 0.7 title 'gloo', '/work/main/bench/results/20261201T214117Z/plots/data/limits_n8.csv' using 1:2 with lines dt 2 lw 1.5 lc rgb 'black' title 'limit shm', '/work/main/bench/results/20261201T214117Z/plots/data/limits_n8.csv' using 1:3 with lines dt 3 lw 1.5 lc rgb 'gray40' title 'limit tcp'
unset multiplot
