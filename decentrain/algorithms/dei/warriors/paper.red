;redcode-94
;name Little Paper
;author decentrain
;strategy a replicator: copies its six lines far ahead, splits to the copy, repeats
len     equ     6
dist    equ     2667
start   mov.ab  #len, src
copy    mov.i   }src, >dst
        jmn.b   copy, src
        spl     @dst
        add.ab  #dist, dst
        jmp     start
src     dat     #0, #0
dst     dat     #0, #dist
        end     start
