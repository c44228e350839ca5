;redcode-94
;name Dwarf
;author A. K. Dewdney (1984)
;strategy a stone: drops a DAT bomb on every fourth cell
step    equ     4
        org     bomb+1
bomb    dat     #0, #0
start   add.ab  #step, bomb
        mov.ab  #0, @bomb
        jmp     start
        end
