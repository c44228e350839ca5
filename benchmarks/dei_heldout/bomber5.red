;redcode-94
;name Mod-5 Bomber
;author decentrain (held out: no DEI run trains on or fights this warrior)
step    equ     5
        org     loop
loop    add.ab  #step, ptr
        mov.i   bomb, @ptr
        jmp     loop
ptr     dat     #0, #0
bomb    dat     #0, #0
        end
