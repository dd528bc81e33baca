set terminal pngcairo size 1000,700
set output "/work/main/docs/sweep_ddp_1gbit/accuracy_vs_bytes.png"

set logscale x
set xrange [7278.29:5.64427e+06]
set yrange [82.11:88.14]
set xlabel "wire bytes per step per rank (log scale)"
set ylabel "test accuracy (%)"
set title "PyTorch DDP (gloo) + gcomp hook, Fashion-MNIST MLP, 1 epochs, 4 ranks, 1gbit links" noenhanced
set format x "%.0s %cB"
set grid
set key bottom right box opaque
plot "/work/main/docs/sweep_ddp_1gbit/accuracy_vs_bytes.dat" index 0 using 1:2 with points pt 7 ps 1.5 lc rgb "#1f77b4" title "error feedback", \
     '' index 0 using 4:5:3 with labels center font ",9" notitle, \
     '' index 1 using 1:2 with points pt 6 ps 1.5 lc rgb "#d62728" title "no error feedback", \
     '' index 1 using 4:5:3 with labels center font ",9" notitle
